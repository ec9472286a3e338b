package testenv_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"billing/internal/testenv"
)

var migrations atomic.Int32

func TestMain(m *testing.M) {
	testenv.SetMigrator(func(ctx context.Context, db *sql.DB) error {
		migrations.Add(1)
		_, err := db.ExecContext(ctx, `CREATE TABLE schema_marker (v text); INSERT INTO schema_marker VALUES ('migrated')`)
		return err
	})
	testenv.Main(m)
}

func TestDatabasesAreIsolated(t *testing.T) {
	u1, u2 := testenv.DatabaseURL(t), testenv.DatabaseURL(t)
	p1, _ := url.Parse(u1)
	p2, _ := url.Parse(u2)
	if p1.Path == p2.Path {
		t.Fatalf("same database twice: %s", p1.Path)
	}
	// Only the database name differs from the server URL.
	p1.Path, p2.Path = "", ""
	if p1.String() != p2.String() {
		t.Fatalf("URLs differ beyond the dbname: %s vs %s", p1, p2)
	}

	ctx := context.Background()
	db1, err := sql.Open("pgx", u1)
	if err != nil {
		t.Fatal(err)
	}
	defer db1.Close()
	db2, err := sql.Open("pgx", u2)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()

	if _, err := db1.ExecContext(ctx, "CREATE TABLE only_in_one (id int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db2.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'only_in_one'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("table created in one database is visible in the other")
	}
	// Both are clones of the migrated template.
	for _, db := range []*sql.DB{db1, db2} {
		var v string
		if err := db.QueryRowContext(ctx, "SELECT v FROM schema_marker").Scan(&v); err != nil || v != "migrated" {
			t.Fatalf("template not applied: %q %v", v, err)
		}
	}
}

func TestMigratorRunsOnce(t *testing.T) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			testenv.DatabaseURL(t)
		}()
	}
	wg.Wait()
	if got := migrations.Load(); got != 1 {
		t.Fatalf("migrator ran %d times", got)
	}
}

func TestParallelDatabases(t *testing.T) {
	for _, name := range []string{"a", "b", "c", "d"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testenv.DB(t)
			if err := db.Exec("CREATE TABLE t (name text)").Error; err != nil {
				t.Fatal(err)
			}
			if err := db.Exec("INSERT INTO t VALUES (?)", name).Error; err != nil {
				t.Fatal(err)
			}
			var got []string
			if err := db.Raw("SELECT name FROM t").Scan(&got).Error; err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != name {
				t.Fatalf("got %v", got)
			}
		})
	}
}

func TestDatabaseDroppedAfterTest(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		db := testenv.DB(t)
		if err := db.Raw("SELECT current_database()").Scan(&name).Error; err != nil {
			t.Fatal(err)
		}
	})
	admin, err := sql.Open("pgx", testenv.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.QueryRow("SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("database %s still exists after its test", name)
	}
}

// TestOutage shows the pattern for database-outage tests.
func TestOutage(t *testing.T) {
	c := testenv.Cluster()
	if c == nil {
		t.Skip("TEST_DATABASE_URL is set: the server is not ours to stop")
	}
	db := testenv.DB(t)
	if err := db.Exec("SELECT 1").Error; err != nil {
		t.Fatal(err)
	}
	if err := c.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("SELECT 1").Error; err == nil {
		t.Fatal("query succeeded while the server was down")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The pool discards dead connections and reconnects to the same URL.
	var err error
	for range 3 {
		if err = db.Exec("SELECT 1").Error; err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("after Restart: %v", err)
	}
}

func TestClusterNilWithExternalServer(t *testing.T) {
	if os.Getenv(testenv.EnvDatabaseURL) == "" {
		t.Skip("no TEST_DATABASE_URL")
	}
	if testenv.Cluster() != nil {
		t.Fatal("Cluster() should be nil with TEST_DATABASE_URL")
	}
}

func TestStripeMock(t *testing.T) {
	base := testenv.StripeMockURL(t)
	if again := testenv.StripeMockURL(t); again != base {
		t.Fatalf("second call started another server: %s vs %s", base, again)
	}
	req, err := http.NewRequest("GET", base+"/v1/customers", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk_test_123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	var body struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.Object != "list" {
		t.Fatalf("object = %q, want list", body.Object)
	}
}

func TestClock(t *testing.T) {
	c := testenv.NewClock(testenv.At(0))
	if got := c.Now(); !got.Equal(time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("At(0) = %s, want 2024-06-01T00:00:00Z", got)
	}
	// Readers and a writer at once: go test -race reports an unguarded clock.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				c.Now()
			}
		})
	}
	for range 100 {
		c.Add(time.Second)
	}
	wg.Wait()
	if got, want := c.Now(), testenv.At(100); !got.Equal(want) {
		t.Fatalf("after 100 Add(1s): %s, want %s", got, want)
	}
	c.Set(testenv.At(-5))
	if got, want := c.Now(), testenv.At(-5); !got.Equal(want) {
		t.Fatalf("after Set: %s, want %s", got, want)
	}
}
