package database

import (
	"database/sql"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// ScanAll reads every row of rows into a T, matching each column to the struct field whose gorm
// column tag names it (the names gorm itself scans by), and closes rows. A query's column list
// and a struct never have to be kept in the same order by hand: a column no field names is an
// error, so a typo fails loudly instead of scanning into the wrong field. Fields of embedded
// structs count as the outer struct's. The column→field mapping is computed once per struct type
// and column list, so the hot reads pay no more reflection than a positional scan.
func ScanAll[T any](rows *sql.Rows) ([]T, error) {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var zero T
	paths, err := fieldPaths(reflect.TypeOf(zero), cols)
	if err != nil {
		return nil, err
	}
	var out []T
	dest := make([]any, len(paths))
	for rows.Next() {
		var v T
		rv := reflect.ValueOf(&v).Elem()
		for i, p := range paths {
			dest[i] = rv.FieldByIndex(p).Addr().Interface()
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

type pathsKey struct {
	t    reflect.Type
	cols string
}

var pathsCache sync.Map // pathsKey → [][]int

func fieldPaths(t reflect.Type, cols []string) ([][]int, error) {
	key := pathsKey{t, strings.Join(cols, ",")}
	if p, ok := pathsCache.Load(key); ok {
		return p.([][]int), nil
	}
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("database.ScanAll: %s is not a struct", t)
	}
	byName := map[string][]int{}
	collectColumns(t, nil, byName)
	paths := make([][]int, len(cols))
	for i, c := range cols {
		p, ok := byName[c]
		if !ok {
			return nil, fmt.Errorf("database.ScanAll: no field of %s has column %q", t, c)
		}
		paths[i] = p
	}
	pathsCache.Store(key, paths)
	return paths, nil
}

func collectColumns(t reflect.Type, prefix []int, byName map[string][]int) {
	for i := range t.NumField() {
		f := t.Field(i)
		path := append(append([]int(nil), prefix...), i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			collectColumns(f.Type, path, byName)
			continue
		}
		if name := columnTag(f.Tag.Get("gorm")); name != "" {
			if _, dup := byName[name]; !dup { // the outer struct's field wins, as in Go
				byName[name] = path
			}
		}
	}
}

// columnTag is the column:NAME part of a gorm tag.
func columnTag(tag string) string {
	for _, part := range strings.Split(tag, ";") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(part), "column:"); ok {
			return name
		}
	}
	return ""
}
