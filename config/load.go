package config

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"
)

// loader keeps the first parse error so Load can read every key linearly.
type loader struct {
	v   *viper.Viper
	err *Error
}

func (l *loader) fail(e *Error) {
	if l.err == nil {
		l.err = e
	}
}

func envName(key string) string {
	return envPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// raw returns the value as text. YAML may yield ints/bools/lists; we
// stringify and parse ourselves so garbage is reported instead of zeroed.
func (l *loader) raw(key string) string {
	val := l.v.Get(key)
	switch t := val.(type) {
	case nil:
		return ""
	case string:
		return strings.TrimSpace(t)
	case []any:
		l.fail(errorf(key, "must be a single value, not a list"))
		return ""
	case map[string]any:
		l.fail(errorf(key, "must be a single value, not a map"))
		return ""
	default:
		return strings.TrimSpace(fmt.Sprint(t))
	}
}

func (l *loader) str(key string) string { return l.raw(key) }

func (l *loader) duration(key string) time.Duration {
	s := l.raw(key)
	d, err := time.ParseDuration(s)
	if err != nil {
		l.fail(errorf(key, "invalid duration %q (want e.g. 30s, 5m)", s))
	}
	return d
}

func (l *loader) integer(key string) int {
	s := l.raw(key)
	n, err := strconv.Atoi(s)
	if err != nil {
		l.fail(errorf(key, "invalid integer %q", s))
	}
	return n
}

func (l *loader) boolean(key string) bool {
	s := l.raw(key)
	b, err := strconv.ParseBool(s)
	if err != nil {
		l.fail(errorf(key, "invalid boolean %q (want true or false)", s))
	}
	return b
}

// secretSource resolves a secret's *_FILE variant. It returns the file
// contents and true if a file was named; otherwise the caller reads the key
// normally. Env beats YAML; naming both a value and a file at the same layer
// is ambiguous and rejected. Messages never include the secret itself.
func (l *loader) secretSource(key string) (string, bool) {
	if !slices.Contains(secretKeys, key) {
		panic("config: " + key + " is read as a secret but is not in secretKeys")
	}
	env := envName(key)
	fileEnv := env + "_FILE"
	var path, from string
	switch {
	case os.Getenv(fileEnv) != "":
		if os.Getenv(env) != "" {
			l.fail(errorf(key, "both %s and %s are set; use one", env, fileEnv))
			return "", true
		}
		path, from = os.Getenv(fileEnv), fileEnv
	case os.Getenv(env) != "":
		return "", false
	case l.v.InConfig(key + "_file"):
		if l.v.InConfig(key) {
			l.fail(errorf(key, "both %s and %s_file are set in the config file; use one", key, key))
			return "", true
		}
		path, from = l.v.GetString(key+"_file"), key+"_file"
	default:
		return "", false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		l.fail(errorf(key, "reading %s: %v", from, err))
		return "", true
	}
	return strings.TrimRight(string(b), " \t\r\n"), true
}

func (l *loader) secret(key string) string {
	if s, ok := l.secretSource(key); ok {
		return s
	}
	return l.raw(key)
}

// secretList accepts a YAML list, or a string of comma-separated values
// (files may also separate with newlines). Blank entries are dropped.
func (l *loader) secretList(key string) []string {
	if s, ok := l.secretSource(key); ok {
		return splitList(s)
	}
	switch t := l.v.Get(key).(type) {
	case nil:
		return nil
	case []any:
		var out []string
		for _, e := range t {
			if s := strings.TrimSpace(fmt.Sprint(e)); s != "" {
				out = append(out, s)
			}
		}
		return out
	case []string:
		return splitList(strings.Join(t, ","))
	case string:
		return splitList(t)
	default:
		l.fail(errorf(key, "must be a list or a comma-separated string"))
		return nil
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' }) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// loopbackAlias turns localhost:port into 127.0.0.1:port. localhost is loopback by definition, but
// listening on the name would resolve it (/etc/hosts, DNS), which may answer another address.
func loopbackAlias(addr string) string {
	if host, port, err := net.SplitHostPort(addr); err == nil && strings.EqualFold(host, "localhost") {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}
