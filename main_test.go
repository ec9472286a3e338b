package main

import (
	"testing"

	"billing/internal/testenv"
	"billing/migrations"
)

// Test databases are clones of one migrated template; stripe-mock is started on first use.
func TestMain(m *testing.M) {
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}
