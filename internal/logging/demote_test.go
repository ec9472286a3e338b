package logging

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestDemoteLogsTheNamedInfoMessagesAtDebug(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var buf bytes.Buffer
		l := slog.New(Demote(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}), ": Producer job counts")).With("component", "river")
		l.Info("producer_default: Producer job counts", "num_jobs_running", 1)
		l.Info("River client started")
		l.Warn("elector: Producer job counts") // only info is demoted
		out := buf.String()
		if !strings.Contains(out, "level=INFO msg=\"River client started\" component=river") || !strings.Contains(out, "level=WARN") {
			t.Errorf("level %s: other records changed:\n%s", level, out)
		}
		demoted := strings.Contains(out, "level=DEBUG msg=\"producer_default: Producer job counts\"")
		if demoted != (level == slog.LevelDebug) || strings.Contains(out, "level=INFO msg=\"producer_default") {
			t.Errorf("level %s: the job counts should appear at debug only, and only when debug is on:\n%s", level, out)
		}
	}
}
