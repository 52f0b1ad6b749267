package otelidem
