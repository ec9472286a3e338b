package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"gorm.io/gorm"

	"billing/appevents"
	"billing/config"
)

// eventsCommand is `billing events tail`.
func eventsCommand(args []string) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	return runEventsCommand(ctx, args, os.Stdout, os.Stderr)
}

var eventsHelp = commandHelp{
	Usage: "billing events tail [--after ID] [--limit N] [--follow=true|false] [--json] [--config PATH]",
	About: "Prints the app events of stripe.mode's world — what the app is told (pushed to\n" +
		"app_events.url and listed by GET /v1/app-events) — one line per event in feed order:\n" +
		"  2026-12-07T11:00:00Z aevt_… entitlement.updated user=u_1 seq=3 entitled=true status=active changed=entitled,status\n" +
		"then follows new ones (it looks every 500 ms) until interrupted. It reads the feed from the\n" +
		"database, as the API does: under make run it finds the running service's, with no database.url\n" +
		"the embedded cluster. --json prints each body as pushed, one JSON object a line.\n" +
		"Exit 0 when done or stopped (SIGINT, SIGTERM), 2 when it could not read the feed or --after\n" +
		"names no event of the mode.",
	Env: configEnv("database.url holds the feed; stripe.mode is the world listed"),
}

// eventsPoll is how often tail looks for new events while following.
const eventsPoll = 500 * time.Millisecond

func runEventsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("events tail", flag.ContinueOnError)
	after := fs.String("after", "", "start after this event id (default: the first event)")
	limit := fs.Int("limit", 0, "stop after this many events (default: no limit)")
	follow := fs.Bool("follow", true, "keep printing new events as they come")
	asJSON := fs.Bool("json", false, "print each event's body as pushed, one JSON object a line")
	cfgPath := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	if len(args) == 0 || args[0] != "tail" {
		// tail is the one subcommand: -h on events shows its usage.
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			eventsHelp.print(stdout, fs)
			return 0
		}
		fmt.Fprintln(stderr, "billing events: the one subcommand is tail")
		eventsHelp.print(stderr, fs)
		return exitUsage
	}
	if code, done := parseFlagsTo(fs, eventsHelp, args[1:], stdout, stderr, true); done {
		return code
	}
	stopped := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "billing events tail: "+format+"\n", args...)
		return exitUsage
	}
	if *limit < 0 {
		return stopped("--limit must be 0 (no limit) or more, got %d", *limit)
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return stopped("%s", err.Error())
	}
	db, _, release, problem := toolDatabase(ctx, cfg, stderr)
	if problem != "" {
		return stopped("%s", problem)
	}
	defer release()
	err = tailEvents(ctx, db, cfg.Stripe.Mode == "live", tailOptions{After: *after, Limit: *limit, Follow: *follow, JSON: *asJSON}, stdout)
	switch {
	case errors.Is(err, appevents.ErrUnknownCursor):
		return stopped("--after %s names no app event of %s mode", *after, cfg.Stripe.Mode)
	case err != nil && ctx.Err() == nil:
		return stopped("%v", err)
	}
	return 0
}

type tailOptions struct {
	After  string
	Limit  int
	Follow bool
	JSON   bool
}

// tailEvents prints the feed from o.After, following it until ctx ends when o.Follow.
func tailEvents(ctx context.Context, db *gorm.DB, livemode bool, o tailOptions, w io.Writer) error {
	after, printed := o.After, 0
	// One timer for the whole tail, armed after each page that left nothing more to read: an
	// idle tail wakes twice a second for one query, and never spins.
	wait := time.NewTimer(eventsPoll)
	defer wait.Stop()
	for {
		page, err := appevents.Feed(ctx, db, livemode, after, 500)
		if err != nil {
			return err
		}
		for _, b := range page.Events {
			if o.JSON {
				line, err := json.Marshal(b)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\n", line)
			} else {
				fmt.Fprintln(w, eventLine(b))
			}
			after = b.ID
			if printed++; o.Limit > 0 && printed >= o.Limit {
				return nil
			}
		}
		if page.HasMore {
			continue
		}
		if !o.Follow {
			return nil
		}
		wait.Reset(eventsPoll)
		select {
		case <-ctx.Done():
			return nil
		case <-wait.C:
		}
	}
}

// eventLine is one event as tail prints it: when, id, type, user and sequence, then what the
// app reads of it.
func eventLine(b appevents.Body) string {
	var d map[string]any
	_ = json.Unmarshal(b.Data, &d)
	field := func(k string) string {
		v, ok := d[k]
		if !ok || v == nil {
			return "null"
		}
		if s, ok := v.(string); ok {
			return s
		}
		j, _ := json.Marshal(v)
		return string(j)
	}
	var parts []string
	switch b.Type {
	case appevents.TypeEntitlementUpdated:
		parts = append(parts, "entitled="+field("entitled"), "status="+field("status"))
		if prev, ok := d["previous"].(map[string]any); ok && len(prev) > 0 {
			names := make([]string, 0, len(prev))
			for k := range prev {
				names = append(names, k)
			}
			slices.Sort(names)
			parts = append(parts, "changed="+strings.Join(names, ","))
		}
	case appevents.TypeChargeUpdated:
		parts = append(parts, "order_id="+field("order_id"), "status="+field("status"), "amount_refunded="+field("amount_refunded"))
	case appevents.TypeUsageNeedsReview:
		parts = append(parts, "usage_id="+field("usage_id"), "meter="+field("meter"), "status="+field("status"))
	}
	return fmt.Sprintf("%s %s %s user=%s seq=%d %s", time.Unix(b.Created, 0).UTC().Format(time.RFC3339), b.ID, b.Type,
		b.UserID, b.Sequence, strings.Join(parts, " "))
}
