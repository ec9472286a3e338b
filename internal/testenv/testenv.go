// Package testenv is the shared test harness: per-test PostgreSQL databases
// cloned from a once-migrated template, and a stripe-mock server.
//
// Every package that uses it calls Main from its TestMain:
//
//	func TestMain(m *testing.M) {
//		testenv.SetMigrator(migrations.Apply) // optional
//		testenv.Main(m)
//	}
//
// or, with a migrator, testenv.MainWith(m, migrations.Apply).
//
// Database server: if TEST_DATABASE_URL is set (URL form only,
// postgres://user:pass@host:port/db?params — keyword/value DSNs are
// rejected), that server is used; the role needs CREATEDB and the server
// must be PostgreSQL 13+ (DROP DATABASE ... WITH (FORCE)). Otherwise each
// test binary starts its own throwaway pgcluster in a temp dir on first use,
// so packages that never touch the database don't pay for initdb.
//
// Several test binaries may share one TEST_DATABASE_URL server concurrently
// (go test ./... runs packages in parallel): each binary uses its own
// template database named tpl_<pid>_<random>, and test databases are named
// t_<random>. Templates are dropped in Main's teardown; a binary that is
// killed leaves its template (and open test databases) behind on a shared
// server.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"billing/internal/pgcluster"
)

// EnvDatabaseURL names the variable selecting an external server.
const EnvDatabaseURL = "TEST_DATABASE_URL"

var (
	mainCalled bool

	mu       sync.Mutex
	migrator func(ctx context.Context, db *sql.DB) error

	// server state, set once by startServer.
	serverOnce    sync.Once
	serverErr     error
	baseURL       *url.URL // any database on the server; only the path is replaced
	cluster       *pgcluster.Cluster
	clusterDir    string
	admin         *sql.DB // pool on the server's "postgres" database
	serverVersion int     // server_version_num, e.g. 150018

	// template state, set once by prepareTemplate.
	templateOnce sync.Once
	templateErr  error
	templateName string
)

// SetMigrator registers the function that brings an empty database to the
// current schema. It runs once per test binary on the template database.
// Call it before Main (or at least before the first DatabaseURL).
func SetMigrator(f func(ctx context.Context, db *sql.DB) error) {
	mu.Lock()
	defer mu.Unlock()
	migrator = f
}

// MainWith is SetMigrator(migrate) then Main(m): the whole TestMain of a package whose tests
// need the schema, so that the preamble is one line.
func MainWith(m *testing.M, migrate func(ctx context.Context, db *sql.DB) error) {
	SetMigrator(migrate)
	Main(m)
}

// Main runs the tests and tears down whatever the harness started (template
// database, private cluster, stripe-mock), then exits with the tests' code.
func Main(m *testing.M) {
	mainCalled = true
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: teardown: %v\n", err)
	}
	os.Exit(code)
}

func teardown() error {
	var errs []error
	if admin != nil {
		if templateName != "" {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(templateName)+" WITH (FORCE)")
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("dropping template %s: %w", templateName, err))
			}
		}
		admin.Close()
	}
	if cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := cluster.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	if clusterDir != "" {
		os.RemoveAll(clusterDir)
	}
	stopStripeMock()
	return errors.Join(errs...)
}

// startServer connects to TEST_DATABASE_URL or starts the private cluster.
func startServer() error {
	serverOnce.Do(func() { serverErr = doStartServer() })
	return serverErr
}

func doStartServer() error {
	if !mainCalled {
		return errors.New("testenv: call testenv.Main(m) from TestMain in this package (it tears the database server down)")
	}
	if raw := os.Getenv(EnvDatabaseURL); raw != "" {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return fmt.Errorf("testenv: %s must be a postgres:// URL (keyword/value DSNs are not supported), got %q", EnvDatabaseURL, raw)
		}
		baseURL = u
	} else {
		d, err := os.MkdirTemp("", "billing-testenv-")
		if err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
		clusterDir = d
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// RemoveOnExit: if the binary dies (test timeout panic, Ctrl-C),
		// the cluster's watchdog stops the server and deletes the dir.
		c, err := pgcluster.Start(ctx, pgcluster.Options{Dir: d, NoSync: true, RemoveOnExit: true})
		if err != nil {
			os.RemoveAll(d)
			clusterDir = ""
			if errors.Is(err, pgcluster.ErrNoServer) {
				return fmt.Errorf("testenv: %w (or set %s to a server the tests may create databases on)", err, EnvDatabaseURL)
			}
			return fmt.Errorf("testenv: starting PostgreSQL: %w", err)
		}
		cluster = c
		baseURL, _ = url.Parse(c.URL("postgres"))
	}
	db, err := sql.Open("pgx", withDBName(baseURL, "postgres"))
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return fmt.Errorf("testenv: connecting to %s: %w", redact(withDBName(baseURL, "postgres")), err)
	}
	if err := db.QueryRowContext(ctx, "SELECT current_setting('server_version_num')::int").Scan(&serverVersion); err != nil {
		db.Close()
		return fmt.Errorf("testenv: %w", err)
	}
	admin = db
	return nil
}

// prepareTemplate creates this binary's template database and migrates it.
func prepareTemplate() error {
	templateOnce.Do(func() { templateErr = doPrepareTemplate() })
	return templateErr
}

func doPrepareTemplate() error {
	if err := startServer(); err != nil {
		return err
	}
	name := fmt.Sprintf("tpl_%d_%s", os.Getpid(), randomHex(4))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// template0, not the default template1: nothing can be connected to it
	// (which would make CREATE DATABASE fail) and it is pristine on shared
	// servers.
	if err := execRetry(ctx, "CREATE DATABASE "+quoteIdent(name)+" TEMPLATE template0"); err != nil {
		return fmt.Errorf("testenv: creating template database: %w", err)
	}
	templateName = name // from now on teardown drops it

	mu.Lock()
	migrate := migrator
	mu.Unlock()
	if migrate != nil {
		db, err := sql.Open("pgx", withDBName(baseURL, name))
		if err != nil {
			return fmt.Errorf("testenv: %w", err)
		}
		err = migrate(ctx, db)
		db.Close()
		if err != nil {
			return fmt.Errorf("testenv: migrating template database: %w", err)
		}
	}
	// CREATE DATABASE ... TEMPLATE fails while anyone is connected to the
	// template, so forbid new connections and kick out any stragglers (for
	// example connections the migrator leaked).
	if _, err := admin.ExecContext(ctx, "ALTER DATABASE "+quoteIdent(name)+" ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	if _, err := admin.ExecContext(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// DatabaseURL creates a new database for this test, cloned from the migrated
// template (empty when no migrator is set), and drops it (WITH FORCE) when
// the test ends. The URL is the server URL with only the database name
// replaced.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	if err := prepareTemplate(); err != nil {
		t.Fatal(err)
	}
	name := "t_" + randomHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stmt := "CREATE DATABASE " + quoteIdent(name) + " TEMPLATE " + quoteIdent(templateName)
	if cluster != nil && serverVersion >= 150000 {
		// Our own PostgreSQL 15+ fsync=off cluster: copying files (plus a
		// cheap checkpoint) beats the WAL_LOG default, ~70ms vs ~110ms per
		// database. External servers keep their default, where forced
		// checkpoints may be expensive.
		stmt += " STRATEGY FILE_COPY"
	}
	if err := execRetry(ctx, stmt); err != nil {
		t.Fatalf("testenv: creating test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := execRetry(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name)+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: dropping test database %s (restart the cluster if a test stopped it): %v", name, err)
		}
	})
	return withDBName(baseURL, name)
}

// DB opens a fresh database (see DatabaseURL) with gorm, silent logger. The
// connection pool is closed before the database is dropped.
func DB(t testing.TB) *gorm.DB {
	t.Helper()
	dsn := DatabaseURL(t)
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatalf("testenv: opening %s: %v", redact(dsn), err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// Registered after DatabaseURL's cleanup, so it runs before the DROP.
	t.Cleanup(func() { sqlDB.Close() })
	return db
}

// AdminURL is the URL of the server's "postgres" database (for CREATE
// DATABASE and the like). It starts the server if needed and panics if that
// fails; call DatabaseURL(t) first to get a t.Fatal instead.
func AdminURL() string {
	if err := startServer(); err != nil {
		panic(err)
	}
	return withDBName(baseURL, "postgres")
}

// Cluster returns the private cluster (starting it if needed; panics if
// that fails), or nil when TEST_DATABASE_URL is in use — outage tests that
// stop/restart the server should skip then. Stopping it affects every test
// in the binary running at that moment, so outage tests must not be
// parallel.
func Cluster() *pgcluster.Cluster {
	if os.Getenv(EnvDatabaseURL) != "" {
		return nil
	}
	if err := startServer(); err != nil {
		panic(err)
	}
	return cluster
}

// execRetry runs an admin statement, retrying connection-level failures
// (e.g. a test just restarted the cluster and the pool holds dead
// connections). Server-reported errors are returned at once.
func execRetry(ctx context.Context, stmt string) error {
	for attempt := 0; ; attempt++ {
		_, err := admin.ExecContext(ctx, stmt)
		var pgErr *pgconn.PgError
		if err == nil || errors.As(err, &pgErr) || attempt >= 20 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func withDBName(u *url.URL, name string) string {
	v := *u
	v.Path = "/" + name
	v.RawPath = ""
	return v.String()
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
