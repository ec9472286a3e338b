package config

import (
	"slices"
	"strings"

	"github.com/spf13/viper"
)

// knownKey reports whether key (dotted, lower case) is a configuration key or a secret's _file.
func knownKey(key string) bool {
	if _, ok := defaults[key]; ok {
		return true
	}
	base, ok := strings.CutSuffix(key, "_file")
	return ok && slices.Contains(secretKeys, base)
}

// knownSection reports whether key is a section of keys (stripe, stripe.webhook_secrets).
func knownSection(key string) bool {
	for k := range defaults {
		if strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

// checkFileKeys refuses a key of the YAML file that the service does not read: a misspelt key
// (stripe: {mod: live}) or block (databse:) would otherwise leave its default in force silently,
// and for database.url the default is a throwaway embedded cluster. A second reader sees the
// file's keys alone, without the defaults and the environment.
func checkFileKeys(path string) *Error {
	f := viper.New()
	f.SetConfigFile(path)
	f.SetConfigType("yaml")
	if err := f.ReadInConfig(); err != nil {
		return errorf("config", "reading %s: %v", path, err)
	}
	keys := f.AllKeys()
	slices.Sort(keys)
	for _, k := range keys {
		if knownKey(k) {
			continue
		}
		// An empty block ("database:" with every key commented out) sets nothing.
		if knownSection(k) {
			if f.Get(k) == nil {
				continue
			}
			return errorf(k, "in %s is a block of keys (%s.…), not a value", path, k)
		}
		return errorf(k, "unknown key in %s%s", path, suggest(k, fileKeys()))
	}
	return nil
}

// checkEnvNames refuses a BILLING_ variable that names no key (BILLING_STRIPE_MOD): the operator
// meant something by it. Empty ones are unset, as everywhere in the environment.
func checkEnvNames(environ []string) *Error {
	known := map[string]bool{ConfigEnv: true}
	for k := range defaults {
		known[envName(k)] = true
	}
	for _, k := range secretKeys {
		known[envName(k)+"_FILE"] = true
	}
	var unknown []string
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix+"_") && val != "" && !known[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	return errorf(unknown[0], "unknown environment variable: no configuration key has this name%s", suggest(unknown[0], names))
}

// fileKeys lists every key a YAML file may set.
func fileKeys() []string {
	out := make([]string, 0, len(defaults)+len(secretKeys))
	for k := range defaults {
		out = append(out, k)
	}
	for _, k := range secretKeys {
		out = append(out, k+"_file")
	}
	return out
}

// suggest names the closest of candidates to name when it is a likely misspelling of it.
func suggest(name string, candidates []string) string {
	best, bestD := "", 3 // at most two edits away
	slices.Sort(candidates)
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + best + "?)"
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
