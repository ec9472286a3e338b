package migrations_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"billing/migrations"
)

// allModes marks a statement that spans both modes' worlds on purpose (the admin console, the
// retention pruner, the migrations' own bookkeeping). It is written inside the SQL, so that the
// reason sits next to the statement and a copy of the statement elsewhere carries it along.
const allModes = "/* all modes"

var (
	// The code writes SQL keywords in upper case; a constant naming a table after one of them is
	// a statement or a piece of one (a statement built from pieces is checked piece by piece).
	tableRefs = regexp.MustCompile(`\b(?:FROM|JOIN|UPDATE|INTO)\s+([a-z_][a-z0-9_]*)`)
	// A mode bound to an argument: `livemode = $2`, `s.livemode = CAST($2 AS boolean)`, `$2 = livemode`.
	// A join on livemode alone (`c.livemode = s.livemode`) does not choose a world.
	boundMode = regexp.MustCompile(`(?i)\blivemode\s*(=|<>)\s*(CAST\s*\(\s*)?\$\d+|\$\d+\s*(=|<>)\s*([a-z_]+\.)?livemode\b`)
	// An insert that names the mode among its columns writes into one world.
	insertMode = regexp.MustCompile(`(?is)\bINSERT\s+INTO\s+[a-z_]+\s*(AS\s+[a-z_]+\s*)?\([^)]*\blivemode\b`)
)

// TestEveryStatementNamesItsMode walks every SQL statement written in the service's Go code (not
// its tests) and fails when one reads or writes a table that has a livemode column without
// naming livemode: a deployment answers from its own mode's world only, and a query that forgets
// the mode must not be writable. The tables are read from the migrated schema, so a new table with
// a livemode column is covered the day it is created.
func TestEveryStatementNamesItsMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t)
	if err := migrations.Apply(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `
		SELECT DISTINCT table_name FROM information_schema.columns
		WHERE table_schema = 'public' AND column_name = 'livemode'`)
	if err != nil {
		t.Fatal(err)
	}
	moded := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		moded[name] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"customers", "subscriptions", "webhook_events", "charges"} {
		if !moded[want] {
			t.Fatalf("table %s has no livemode column: the walk would check nothing", want)
		}
	}

	statements := 0
	var offenders []string
	for _, st := range sqlStatements(t, "..") {
		statements++
		if strings.Contains(st.sql, allModes) || boundMode.MatchString(st.sql) || insertMode.MatchString(st.sql) {
			continue
		}
		for _, m := range tableRefs.FindAllStringSubmatch(st.sql, -1) {
			if moded[strings.ToLower(m[1])] {
				offenders = append(offenders, st.pos+": "+m[1]+": "+oneLine(st.sql))
				break
			}
		}
	}
	if statements < 50 {
		t.Fatalf("found only %d SQL statements: the walk is not reading the code", statements)
	}
	sort.Strings(offenders)
	for _, o := range offenders {
		t.Errorf("statement on a table with a livemode column binds no mode (add `livemode = $n`, or %s */ when it spans both on purpose):\n  %s", allModes, o)
	}
}

type sqlStatement struct{ pos, sql string }

// sqlStatements returns every string constant of the non-test Go files under root that names a
// table the way SQL does. Constants built with + are joined first, so a statement split over lines
// is read whole.
func sqlStatements(t *testing.T, root string) []sqlStatement {
	t.Helper()
	var out []sqlStatement
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".data", "node_modules", "testdata", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			s, ok := sqlText(n)
			if !ok {
				return true
			}
			if tableRefs.MatchString(s) {
				out = append(out, sqlStatement{pos: fset.Position(n.Pos()).String(), sql: s})
			}
			// A joined constant is read whole; its parts are not read again.
			_, isBin := n.(*ast.BinaryExpr)
			return !isBin
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sqlText is the text of a string literal, or of a + chain with at least one literal; the
// operands that are not literals (a list of columns, a built WHERE clause) stand as "…", so that a
// statement built from pieces is read as one.
func sqlText(n ast.Node) (string, bool) {
	switch e := n.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		l, lok := sqlText(e.X)
		r, rok := sqlText(e.Y)
		if !lok && !rok {
			return "", false
		}
		if !lok {
			l = " … "
		}
		if !rok {
			r = " … "
		}
		return l + r, true
	}
	return "", false
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}
