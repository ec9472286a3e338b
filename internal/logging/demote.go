package logging

import (
	"context"
	"log/slog"
	"strings"
)

// Demote logs at debug the info records of h whose message ends with one of suffixes: a
// library's routine chatter (River's producers log their job counts at info every few seconds
// while jobs run) would otherwise be a tenth of a busy service's log.
func Demote(h slog.Handler, suffixes ...string) slog.Handler {
	return &demoted{h: h, suffixes: suffixes}
}

type demoted struct {
	h        slog.Handler
	suffixes []string
}

func (d *demoted) Enabled(ctx context.Context, l slog.Level) bool { return d.h.Enabled(ctx, l) }

func (d *demoted) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo {
		for _, s := range d.suffixes {
			if strings.HasSuffix(r.Message, s) {
				if !d.h.Enabled(ctx, slog.LevelDebug) {
					return nil
				}
				r.Level = slog.LevelDebug
				break
			}
		}
	}
	return d.h.Handle(ctx, r)
}

func (d *demoted) WithAttrs(as []slog.Attr) slog.Handler {
	return &demoted{h: d.h.WithAttrs(as), suffixes: d.suffixes}
}

func (d *demoted) WithGroup(name string) slog.Handler {
	return &demoted{h: d.h.WithGroup(name), suffixes: d.suffixes}
}
