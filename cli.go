package main

// What every subcommand shares at the command line: its usage text (-h prints it on stdout and
// exits 0; a wrong flag prints it on stderr and exits 2), the version, progress on a terminal.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"billing/config"
	"billing/internal/stripeclient"
	"billing/migrations"
)

// Set at link time when the build has no VCS information (a container build without .git):
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)"
var (
	version = ""
	commit  = ""
)

// buildInfo is what `billing --version` prints.
type buildInfo struct {
	Version, Commit, Time string
	Modified              bool
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: commit}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" && bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.Commit == "" {
					b.Commit = s.Value
				}
			case "vcs.time":
				b.Time = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func printVersion(w io.Writer) {
	b := readBuildInfo()
	commit := b.Commit
	if b.Modified {
		commit += " (with uncommitted changes)"
	}
	if b.Time != "" {
		commit += " of " + b.Time
	}
	fmt.Fprintf(w, "billing %s\ncommit             %s\nStripe API version %s\nGo                 %s\n",
		b.Version, commit, stripeclient.APIVersion, runtime.Version())
}

// commandHelp is a subcommand's usage text.
type commandHelp struct {
	// Usage is the synopsis after "usage: ", About what the command does (may span lines).
	Usage, About string
	// Env lists the environment variables the command reads, with what for.
	Env [][2]string
}

// configEnv is the environment of a command that loads the whole configuration.
func configEnv(purpose string) [][2]string {
	env := [][2]string{{config.ConfigEnv, "YAML configuration file (like --config)"}}
	for _, name := range config.EnvNames() {
		env = append(env, [2]string{name, ""})
	}
	if purpose != "" {
		env[0][1] += "; " + purpose
	}
	return env
}

func (h commandHelp) print(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n", h.Usage)
	if h.About != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(h.About, "\n"))
	}
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fmt.Fprintln(w, "\nflags:")
		out := fs.Output()
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(out)
	}
	if len(h.Env) > 0 {
		fmt.Fprintln(w, "\nenvironment (every secret X may also be read from the file named by X_FILE):")
		for _, e := range h.Env {
			if e[1] == "" {
				fmt.Fprintf(w, "  %s\n", e[0])
			} else {
				fmt.Fprintf(w, "  %-36s %s\n", e[0], e[1])
			}
		}
	}
}

// parseFlags parses a subcommand's flags. done is true when the command must stop with code:
// 0 after -h/--help (the usage on stdout), 2 after a wrong flag (the usage on stderr).
func parseFlags(fs *flag.FlagSet, h commandHelp, args []string) (code int, done bool) {
	return parseFlagsTo(fs, h, args, os.Stdout, os.Stderr, false)
}

// parseFlagsTo is parseFlags writing to the given streams; with noArgs, an argument left after
// the flags is a usage error too.
func parseFlagsTo(fs *flag.FlagSet, h commandHelp, args []string, stdout, stderr io.Writer, noArgs bool) (code int, done bool) {
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		h.print(stdout, fs)
		return 0, true
	case err != nil:
		h.print(stderr, fs)
		return exitUsage, true
	case noArgs && fs.NArg() > 0:
		fmt.Fprintf(stderr, "billing %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		h.print(stderr, fs)
		return exitUsage, true
	}
	return 0, false
}

// usageError prints msg and the usage on stderr; the command exits 2.
func usageError(fs *flag.FlagSet, h commandHelp, msg string) int {
	fmt.Fprintln(os.Stderr, msg)
	h.print(os.Stderr, fs)
	return exitUsage
}

// isTerminal reports whether f is a character device (a terminal, not a file or a pipe).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// migrationProgress shows a run of migrations on a terminal as one line rewritten in place; the
// log keeps its plain line per migration elsewhere. w is the log's writer, so that the line and
// log lines come out in order.
func migrationProgress(w io.Writer) func(migrations.Step) {
	started := time.Now()
	return func(s migrations.Step) {
		if !s.Done {
			fmt.Fprintf(w, "\r\033[Kmigrating %d/%d: %s %d …", s.Index, s.Total, s.Source, s.Version)
			return
		}
		if s.Index == s.Total {
			fmt.Fprintf(w, "\r\033[Kmigrated %d/%d in %s\n", s.Index, s.Total, time.Since(started).Round(time.Millisecond))
		}
	}
}
