package database

import (
	"context"
	"strings"
	"testing"

	"billing/internal/testenv"
)

type inner struct {
	B *string `gorm:"column:b"`
}

type scanRow struct {
	A int64 `gorm:"column:a"`
	inner
	C     bool `gorm:"column:c;not null"`
	Other string
}

func TestScanAllMatchesColumnsByName(t *testing.T) {
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Columns in another order than the fields, one of them from the embedded struct.
	rows, err := sqlDB.QueryContext(ctx, `SELECT true AS c, 'x' AS b, 7::bigint AS a UNION ALL SELECT false, NULL, 8`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ScanAll[scanRow](rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].A != 7 || got[0].B == nil || *got[0].B != "x" || !got[0].C ||
		got[1].A != 8 || got[1].B != nil || got[1].C {
		t.Fatalf("scanned %+v", got)
	}

	rows, err = sqlDB.QueryContext(ctx, `SELECT 1 AS a, 2 AS typo`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ScanAll[scanRow](rows); err == nil || !strings.Contains(err.Error(), `"typo"`) {
		t.Fatalf("a column no field names: %v, want an error naming it", err)
	}
}
