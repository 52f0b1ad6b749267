package core

// ParseKey is parseKey for the fuzz test's oracle (package core_test).
var ParseKey = parseKey
