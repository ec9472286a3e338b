package deploy

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"billing/config"
)

// root is the repository root, where the deployment files live (tests run in deploy/).
const root = ".."

func rootFile(name string) string { return filepath.Join(root, name) }

func readRoot(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(rootFile(name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// configKeys is what config/config.go says about the keys: the defaults map (every key, with its
// default) and the keys Load reads as secrets (through l.secret or l.secretList). It is read from
// the source because the map is unexported: the checks below follow the package without a list
// of their own to keep in step.
type configKeys struct {
	defaults map[string]string
	secret   map[string]bool
}

func readConfigKeys(t *testing.T) configKeys {
	t.Helper()
	path := filepath.Join(root, "config", "config.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ck := configKeys{defaults: map[string]string{}, secret: map[string]bool{}}
	str := func(e ast.Expr) (string, bool) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(lit.Value)
		return s, err == nil
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			if len(n.Names) != 1 || n.Names[0].Name != "defaults" || len(n.Values) != 1 {
				return true
			}
			lit, ok := n.Values[0].(*ast.CompositeLit)
			if !ok {
				return true
			}
			for _, elt := range lit.Elts {
				kv, ok := elt.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				k, ok1 := str(kv.Key)
				v, ok2 := str(kv.Value)
				if !ok1 || !ok2 {
					t.Fatalf("%s: defaults entry is not a pair of string literals", path)
				}
				ck.defaults[k] = v
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "secret" && sel.Sel.Name != "secretList") || len(n.Args) != 1 {
				return true
			}
			if k, ok := str(n.Args[0]); ok {
				ck.secret[k] = true
			}
		}
		return true
	})
	if len(ck.defaults) == 0 {
		t.Fatalf("%s: found no `var defaults = map[string]string{…}`: update readConfigKeys", path)
	}
	if len(ck.secret) == 0 {
		t.Fatalf("%s: found no l.secret(…)/l.secretList(…) calls: update readConfigKeys", path)
	}
	for k := range ck.secret {
		if _, ok := ck.defaults[k]; !ok {
			t.Fatalf("%s: secret key %q has no default", path, k)
		}
	}
	return ck
}

// envName is config's rule: BILLING_ + the key upper-cased, "." → "_".
func envName(key string) string {
	return "BILLING_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// flatten turns nested YAML maps into dotted keys; anything else (scalars, lists) is a leaf.
func flatten(prefix string, m map[string]any, out map[string]any) {
	for k, v := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok {
			flatten(key, sub, out)
			continue
		}
		out[key] = v
	}
}

// clearBillingEnv blanks every BILLING_* variable for the test: config treats an empty variable
// as unset, so a developer's environment cannot leak into Load.
func clearBillingEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "BILLING_") {
			t.Setenv(name, "")
		}
	}
}

func TestConfigExample(t *testing.T) {
	ck := readConfigKeys(t)
	raw := readRoot(t, "config.example.yaml")

	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	got := map[string]any{}
	flatten("", doc, got)

	for k, def := range ck.defaults {
		v, ok := got[k]
		if !ok {
			t.Errorf("config.example.yaml lacks %s (default %q)", k, def)
			continue
		}
		if ck.secret[k] {
			// A secret is its default (empty) or an obvious placeholder, never a real value.
			for _, s := range secretValues(v) {
				if !strings.Contains(strings.ToUpper(s), "REPLACE") {
					t.Errorf("config.example.yaml: secret %s = %q: must be empty or a REPLACE… placeholder", k, s)
				}
			}
			continue
		}
		if s := fmt.Sprint(v); s != def {
			t.Errorf("config.example.yaml: %s = %q, want its default %q", k, s, def)
		}
	}
	for k := range got {
		if _, ok := ck.defaults[k]; !ok {
			t.Errorf("config.example.yaml: unknown key %s", k)
		}
	}
	// Every key has its one-line comment.
	lines := strings.Split(string(raw), "\n")
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, "- ") || !strings.Contains(trimmed, ":") {
			continue
		}
		if strings.HasSuffix(trimmed, ":") && i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "-") {
			// a list key: its comment is above it like any other key's
		} else if strings.HasSuffix(trimmed, ":") {
			continue // a section (http:, stripe:, …)
		}
		if i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#") {
			t.Errorf("config.example.yaml:%d: %q has no comment line above it", i+1, trimmed)
		}
	}

	clearBillingEnv(t)
	cfg, err := config.Load(rootFile("config.example.yaml"))
	if err != nil {
		t.Fatalf("config.Load(config.example.yaml): %v", err)
	}
	if cfg.Stripe.Mode != "test" {
		t.Errorf("stripe.mode = %q: the example must stay in test mode", cfg.Stripe.Mode)
	}
	if cfg.Database.URL != "" {
		t.Errorf("database.url = %q: the example keeps the default (empty)", cfg.Database.URL)
	}
	for _, tok := range slices.Concat(cfg.Auth.APITokens, cfg.Auth.AdminTokens) {
		if len(tok) < 32 {
			t.Errorf("placeholder token %q is shorter than 32 characters", tok)
		}
	}
	if len(cfg.Auth.APITokens) == 0 || len(cfg.Auth.AdminTokens) == 0 || len(cfg.WebhookSecrets(false)) == 0 {
		t.Errorf("the example must show an API token, an admin token and a test webhook secret")
	}

	// The *_file variants that the comments advertise are ones Load accepts: each placeholder
	// secret given from a file instead loads too.
	t.Run("file variants", func(t *testing.T) {
		clearBillingEnv(t)
		dir := t.TempDir()
		files := map[string]string{
			"stripe.secret_key":           "sk_test_from_a_file",
			"stripe.webhook_secrets.test": "whsec_from_a_file_0123456789abcdef0123456789abcdef",
			"auth.api_tokens":             "file-api-0123456789abcdef0123456789abcdef",
			"auth.admin_tokens":           "file-admin-0123456789abcdef0123456789abcdef",
		}
		for k, v := range files {
			p := filepath.Join(dir, k)
			if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv(envName(k)+"_FILE", p)
		}
		cfg, err := config.Load(rootFile("config.example.yaml"))
		if err != nil {
			t.Fatalf("config.Load with *_FILE variables: %v", err)
		}
		if cfg.Stripe.SecretKey != files["stripe.secret_key"] || cfg.Auth.APITokens[0] != files["auth.api_tokens"] {
			t.Errorf("BILLING_…_FILE did not override the example's placeholders")
		}
	})
}

func secretValues(v any) []string {
	switch v := v.(type) {
	case nil:
		return nil
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, fmt.Sprint(e))
		}
		return out
	default:
		if s := fmt.Sprint(v); s != "" {
			return []string{s}
		}
		return nil
	}
}

// composeFile is the part of compose.yaml the test looks at.
type composeFile struct {
	Services map[string]struct {
		Image       string         `yaml:"image"`
		Build       any            `yaml:"build"`
		Environment any            `yaml:"environment"`
		Volumes     []string       `yaml:"volumes"`
		Ports       []string       `yaml:"ports"`
		DependsOn   map[string]any `yaml:"depends_on"`
		Healthcheck *struct {
			Test any `yaml:"test"`
		} `yaml:"healthcheck"`
		StopGracePeriod string `yaml:"stop_grace_period"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func environment(t *testing.T, env any) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch env := env.(type) {
	case map[string]any:
		for k, v := range env {
			out[k] = fmt.Sprint(v)
		}
	case []any:
		for _, e := range env {
			k, v, _ := strings.Cut(fmt.Sprint(e), "=")
			out[k] = v
		}
	case nil:
	default:
		t.Fatalf("environment: unexpected %T", env)
	}
	return out
}

func TestComposeFile(t *testing.T) {
	ck := readConfigKeys(t)
	var cf composeFile
	if err := yaml.Unmarshal(readRoot(t, "compose.yaml"), &cf); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if len(cf.Services) != 2 {
		t.Fatalf("compose.yaml has %d services, want 2 (the database and the service)", len(cf.Services))
	}
	var dbName, appName string
	for name, s := range cf.Services {
		switch {
		case s.Image == "postgres:15":
			dbName = name
		case s.Build != nil:
			appName = name
		}
	}
	if dbName == "" || appName == "" {
		t.Fatalf("compose.yaml: want one service with image postgres:15 and one built from the Dockerfile; got %v", cf.Services)
	}
	db, app := cf.Services[dbName], cf.Services[appName]

	// The database: a named volume, and a pg_isready healthcheck that depends_on can wait for.
	if db.Healthcheck == nil || !strings.Contains(fmt.Sprint(db.Healthcheck.Test), "pg_isready") {
		t.Errorf("service %s: want a healthcheck running pg_isready", dbName)
	}
	named := false
	for _, v := range db.Volumes {
		src, dst, _ := strings.Cut(v, ":")
		if _, ok := cf.Volumes[src]; ok && strings.HasPrefix(dst, "/var/lib/postgresql/data") {
			named = true
		}
	}
	if !named {
		t.Errorf("service %s: want a named volume (declared under volumes:) at /var/lib/postgresql/data; got %v", dbName, db.Volumes)
	}

	// The service.
	dep, ok := app.DependsOn[dbName].(map[string]any)
	if !ok || dep["condition"] != "service_healthy" {
		t.Errorf("service %s: want depends_on %s with condition service_healthy; got %v", appName, dbName, app.DependsOn)
	}
	if app.Healthcheck != nil {
		t.Errorf("service %s: the healthcheck is the Dockerfile's; compose.yaml should not replace it", appName)
	}
	if !slices.ContainsFunc(app.Ports, func(p string) bool { return strings.HasSuffix(p, ":8080") }) {
		t.Errorf("service %s: want port 8080 published; got %v", appName, app.Ports)
	}
	if d, err := time.ParseDuration(app.StopGracePeriod); err != nil || d <= 45*time.Second {
		t.Errorf("service %s: stop_grace_period %q: want more than 45s for a graceful shutdown", appName, app.StopGracePeriod)
	}

	env := environment(t, app.Environment)
	if u := env["BILLING_DATABASE_URL"]; !strings.HasPrefix(u, "postgres://") || !strings.Contains(u, "@"+dbName+":5432/") {
		t.Errorf("BILLING_DATABASE_URL = %q: want a postgres:// URL of service %s", u, dbName)
	}
	if m := env["BILLING_STRIPE_MODE"]; m != "test" {
		t.Errorf("BILLING_STRIPE_MODE = %q, want test", m)
	}
	known := map[string]string{}
	for k := range ck.defaults {
		known[envName(k)] = k
		if ck.secret[k] {
			known[envName(k)+"_FILE"] = k
		}
	}
	for name, val := range env {
		key, ok := known[name]
		if !ok {
			t.Errorf("service %s: %s is not the environment name of any configuration key", appName, name)
			continue
		}
		// Secrets come from the caller's environment and are required: ${VAR:?message}.
		if ck.secret[key] && key != "database.url" && !strings.HasPrefix(val, "${"+name+":?") {
			t.Errorf("service %s: %s = %q: want ${%s:?message}", appName, name, val, name)
		}
	}
	for _, name := range []string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST", "BILLING_AUTH_API_TOKENS", "BILLING_AUTH_ADMIN_TOKENS"} {
		if _, ok := env[name]; !ok {
			t.Errorf("service %s: %s is not set", appName, name)
		}
	}
	if pw := cf.Services[dbName].Environment; !strings.Contains(fmt.Sprint(pw), "${POSTGRES_PASSWORD:?") {
		t.Errorf("service %s: want POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?message}", dbName)
	}
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
	line      int
}

func parseDockerfile(t *testing.T) []instruction {
	t.Helper()
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(readRoot(t, "Dockerfile")), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		cont := strings.HasSuffix(trimmed, "\\")
		cur.WriteString(strings.TrimSuffix(trimmed, "\\"))
		cur.WriteString(" ")
		if cont {
			continue
		}
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " "), start})
		cur.Reset()
	}
	return out
}

func TestDockerfile(t *testing.T) {
	ins := parseDockerfile(t)
	last := -1 // index of the final stage's FROM
	for i, in := range ins {
		if in.cmd == "FROM" {
			last = i
		}
	}
	if last <= 0 {
		t.Fatalf("Dockerfile: want a multi-stage build (a builder stage, then the runtime stage)")
	}
	if !strings.HasPrefix(ins[0].args, "golang:1.26") {
		t.Errorf("Dockerfile: builder stage is FROM %s, want golang:1.26", ins[0].args)
	}
	build := ins[:last]
	final := ins[last:]
	if strings.HasPrefix(final[0].args, "golang") {
		t.Errorf("Dockerfile: the runtime stage must not be the Go toolchain image")
	}

	find := func(in []instruction, cmd string) []instruction {
		var out []instruction
		for _, i := range in {
			if i.cmd == cmd {
				out = append(out, i)
			}
		}
		return out
	}
	var buildRun string
	for _, r := range find(build, "RUN") {
		if strings.Contains(r.args, "go build") {
			buildRun = r.args
		}
	}
	// -X: .git is not in the build context, so --version would name no release or commit.
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w `, "-X main.version=${VERSION}", "-X main.commit=${COMMIT}"} {
		if !strings.Contains(buildRun, want) {
			t.Errorf("Dockerfile: the go build step %q lacks %s", buildRun, want)
		}
	}

	users := find(final, "USER")
	if len(users) == 0 {
		t.Errorf("Dockerfile: the runtime stage has no USER: it would run as root")
	} else {
		u := users[len(users)-1].args
		name, _, _ := strings.Cut(u, ":")
		if name == "" || name == "root" || name == "0" {
			t.Errorf("Dockerfile: USER %s is root", u)
		}
	}

	hc := find(final, "HEALTHCHECK")
	if len(hc) != 1 || !strings.Contains(hc[0].args, "/readyz") || strings.HasPrefix(hc[0].args, "NONE") {
		t.Errorf("Dockerfile: want one HEALTHCHECK of /readyz in the runtime stage; got %v", hc)
	}

	exposes := find(final, "EXPOSE")
	if len(exposes) != 1 || exposes[0].args != "8080" {
		t.Errorf("Dockerfile: want EXPOSE 8080; got %v", exposes)
	}
	// The healthcheck's port comes from BILLING_HTTP_ADDR; it must be the exposed port.
	var addr string
	for _, e := range find(final, "ENV") {
		if v, ok := strings.CutPrefix(e.args, "BILLING_HTTP_ADDR="); ok {
			addr = v
		}
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port != "8080" {
		t.Errorf("Dockerfile: want ENV BILLING_HTTP_ADDR=:8080 (the healthcheck reads its port); got %q", addr)
	}

	var run string
	for _, cmd := range []string{"ENTRYPOINT", "CMD"} {
		if is := find(final, cmd); len(is) > 0 {
			run += is[len(is)-1].args + " "
		}
	}
	if !strings.Contains(run, "serve") {
		t.Errorf("Dockerfile: ENTRYPOINT/CMD %q does not run `billing serve`", run)
	}
}

// TestDockerignore checks that the build context leaves out local state and keeps what the build
// needs (a pattern "billing" would drop the billing/ package, not just bin/billing).
func TestDockerignore(t *testing.T) {
	var patterns []string
	for _, line := range strings.Split(string(readRoot(t, ".dockerignore")), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		patterns = append(patterns, line)
	}
	ignored := func(path string) bool {
		out := false
		for _, p := range patterns {
			neg := strings.HasPrefix(p, "!")
			p = strings.TrimPrefix(strings.TrimPrefix(p, "!"), "/")
			for prefix := path; prefix != "."; prefix = filepath.Dir(prefix) {
				ok, _ := filepath.Match(p, prefix)
				if !ok && strings.HasPrefix(p, "**/") {
					ok, _ = filepath.Match(strings.TrimPrefix(p, "**/"), filepath.Base(prefix))
				}
				if ok {
					out = !neg
					break
				}
			}
		}
		return out
	}
	for _, p := range []string{".git", ".data", "bin", "bin/billing"} {
		if !ignored(p) {
			t.Errorf(".dockerignore: %s is sent to the build", p)
		}
	}
	for _, p := range []string{"go.mod", "go.sum", "main.go", "trigger.go", "billing/billing.go", "config/config.go",
		"migrations/migrations.go", "templates/templates.go", "internal/app/app.go", "webhooks/inbox.go"} {
		if ignored(p) {
			t.Errorf(".dockerignore: %s is needed by the build but left out", p)
		}
	}
}

// TestContainerEngine runs what needs Docker: each subtest is skipped when its tool is missing.
func TestContainerEngine(t *testing.T) {
	docker, err := exec.LookPath("docker")

	t.Run("compose config", func(t *testing.T) {
		if err != nil {
			t.Skip("docker is not on PATH")
		}
		if out, err := exec.Command(docker, "compose", "version").CombinedOutput(); err != nil {
			t.Skipf("docker compose is not available: %v: %s", err, firstLine(out))
		}
		// An empty env file, so that a developer's .env beside compose.yaml plays no part.
		envFile := filepath.Join(t.TempDir(), "empty.env")
		if err := os.WriteFile(envFile, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		required := map[string]string{
			"POSTGRES_PASSWORD":                   "compose0test0password",
			"BILLING_STRIPE_SECRET_KEY":           "sk_test_compose",
			"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_compose_0123456789abcdef0123456789abcdef",
			"BILLING_AUTH_API_TOKENS":             strings.Repeat("a", 40),
			"BILLING_AUTH_ADMIN_TOKENS":           strings.Repeat("b", 40),
		}
		compose := func(set map[string]string) ([]byte, error) {
			cmd := exec.Command(docker, "compose", "--env-file", envFile, "-f", rootFile("compose.yaml"), "config", "-q")
			for _, kv := range os.Environ() {
				name, _, _ := strings.Cut(kv, "=")
				if _, ok := required[name]; !ok && !strings.HasPrefix(name, "BILLING_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			for k, v := range set {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			return stderr.Bytes(), err
		}
		if out, err := compose(required); err != nil {
			t.Fatalf("docker compose config -q: %v\n%s", err, out)
		}
		for name := range required {
			set := map[string]string{}
			for k, v := range required {
				if k != name {
					set[k] = v
				}
			}
			out, err := compose(set)
			if err == nil || !strings.Contains(string(out), name) {
				t.Errorf("without %s: docker compose config should fail naming it; err %v, stderr %s", name, err, out)
			}
		}
	})

	t.Run("image build", func(t *testing.T) {
		if err != nil {
			t.Skip("docker is not on PATH")
		}
		if out, err := exec.Command(docker, "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
			t.Skipf("no container engine (docker info: %v: %s)", err, firstLine(out))
		}
		if testing.Short() {
			t.Skip("-short: not building the image")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		tag := fmt.Sprintf("billing-deploy-test:%d", time.Now().UnixNano())
		build := exec.CommandContext(ctx, docker, "build", "-t", tag, "-f", rootFile("Dockerfile"), root)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("docker build: %v\n%s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command(docker, "image", "rm", "-f", tag).Run() })

		out, err := exec.CommandContext(ctx, docker, "image", "inspect", "--format", "{{.Config.User}}|{{json .Config.Healthcheck}}", tag).Output()
		if err != nil {
			t.Fatalf("docker image inspect: %v", err)
		}
		user, hc, _ := strings.Cut(strings.TrimSpace(string(out)), "|")
		if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
			t.Errorf("image user %q is root", user)
		}
		if !strings.Contains(hc, "/readyz") {
			t.Errorf("image healthcheck %s does not probe /readyz", hc)
		}
		// The static binary runs on the runtime image.
		run := exec.CommandContext(ctx, docker, "run", "--rm", tag, "--help")
		if out, err := run.CombinedOutput(); err != nil || !strings.Contains(string(out), "serve") {
			t.Errorf("docker run %s --help: %v\n%s", tag, err, out)
		}
	})
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
