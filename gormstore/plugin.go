package gormstore

import "gorm.io/gorm"

// Plugin is a stub (no behaviour yet).
func Plugin() gorm.Plugin { return plugin{} }

type plugin struct{}

func (plugin) Name() string                 { return "idem" }
func (plugin) Initialize(db *gorm.DB) error { return nil }
