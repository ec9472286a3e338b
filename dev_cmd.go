package main

// `billing dev`: the dev loop's hands on the dev Stripe of `make run` (cmd/devstripe). It only
// talks HTTP to the dev Stripe's /dev/ endpoints, which play what a customer and time do at Stripe
// and send the service the events; the service's own code path knows nothing of it.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"billing/config"
	"billing/internal/runenv"
)

var devHelp = commandHelp{
	Usage: "billing dev checkout complete SESSION_ID [--card pm_…] | billing dev portal apply SESSION_OR_URL [--cancel | --price P --quantity N] | billing dev advance --days N",
	About: "Plays, at the dev Stripe of `make run`, what a customer and time do at Stripe; the dev\n" +
		"Stripe then sends the service the events Stripe would send.\n\n" +
		"  checkout complete SESSION_ID  pay a Checkout session (cs_…) as its customer: the subscription\n" +
		"                                and its first invoice; --card picks the test card (default the\n" +
		"                                customer's default payment method; pm_card_chargeDeclined declines)\n" +
		"  portal apply SESSION_OR_URL   confirm what a Customer Portal session (bps_…, or the URL the\n" +
		"                                service redirected to) opens: a cancellation at the period's end,\n" +
		"                                or the plan change it names; --price and --quantity choose one\n" +
		"                                (a portal opened on the plan choice needs them), --cancel cancels\n" +
		"                                (a portal opened without a flow)\n" +
		"  advance --days N              move the dev Stripe's clock on: periods renew (charged to the\n" +
		"                                customer's default payment method), trials end, cancellations at\n" +
		"                                the period's end take effect, usage is billed on the renewal's\n" +
		"                                invoice, failed renewals are retried 3, 5 and 7 days apart and\n" +
		"                                the subscription canceled after the last\n\n" +
		"The dev Stripe is found through " + runenv.File + " (written by serve under make run), else\n" +
		"stripe.api_url of the configuration when it is a loopback address in test mode.",
	Env: [][2]string{{config.ConfigEnv, "read only without a running make run: its stripe.api_url"}},
}

func devCommand(args []string) int {
	dir, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "billing dev: "+err.Error())
		return exitFailure
	}
	return devCommandIn(dir, args, os.Stdout, os.Stderr)
}

// devFlags are the flags every dev subcommand takes.
type devFlags struct {
	fs        *flag.FlagSet
	stripeURL *string
	config    *string
}

func newDevFlags(name string) devFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return devFlags{
		fs:        fs,
		stripeURL: fs.String("stripe-url", "", "the dev Stripe's URL (default: STRIPE_URL of "+runenv.File+")"),
		config:    fs.String("config", "", "YAML configuration file, read only without a running make run (default $BILLING_CONFIG)"),
	}
}

// devCommandIn runs `billing dev` from dir (where the run file is looked for).
func devCommandIn(dir string, args []string, stdout, stderr io.Writer) int {
	if len(args) >= 2 && args[0] == "checkout" && args[1] == "complete" {
		f := newDevFlags("dev checkout complete")
		card := f.fs.String("card", "", "the test card to pay with (pm_card_visa, pm_card_chargeDeclined, …; default the customer's default payment method)")
		rest := args[2:]
		if code, done := parseFlagsTo(f.fs, devHelp, rest, stdout, stderr, false); done {
			return code
		}
		// The session id may come before or after the flags.
		if f.fs.NArg() == 0 {
			fmt.Fprintln(stderr, "billing dev checkout complete: the session id (cs_…) is missing")
			devHelp.print(stderr, f.fs)
			return exitUsage
		}
		session := f.fs.Arg(0)
		if code, done := parseFlagsTo(f.fs, devHelp, f.fs.Args()[1:], stdout, stderr, true); done {
			return code
		}
		form := url.Values{}
		if *card != "" {
			form.Set("card", *card)
		}
		return devPost(dir, f, "/dev/checkout/sessions/"+url.PathEscape(session)+"/complete", form, stdout, stderr)
	}
	if len(args) >= 2 && args[0] == "portal" && args[1] == "apply" {
		f := newDevFlags("dev portal apply")
		cancel := f.fs.Bool("cancel", false, "cancel the subscription at its period's end")
		price := f.fs.String("price", "", "the new plan's price (price_…)")
		quantity := f.fs.Int64("quantity", 0, "the new number of seats")
		if code, done := parseFlagsTo(f.fs, devHelp, args[2:], stdout, stderr, false); done {
			return code
		}
		if f.fs.NArg() == 0 {
			fmt.Fprintln(stderr, "billing dev portal apply: the portal session (bps_… or its URL) is missing")
			devHelp.print(stderr, f.fs)
			return exitUsage
		}
		session := portalSessionID(f.fs.Arg(0))
		if code, done := parseFlagsTo(f.fs, devHelp, f.fs.Args()[1:], stdout, stderr, true); done {
			return code
		}
		if *cancel && (*price != "" || *quantity != 0) {
			fmt.Fprintln(stderr, "billing dev portal apply: --cancel or a change (--price, --quantity), not both")
			return exitUsage
		}
		form := url.Values{}
		if *cancel {
			form.Set("action", "cancel")
		}
		if *price != "" {
			form.Set("price", *price)
		}
		if *quantity != 0 {
			form.Set("quantity", strconv.FormatInt(*quantity, 10))
		}
		return devPost(dir, f, "/dev/portal/sessions/"+url.PathEscape(session)+"/apply", form, stdout, stderr)
	}
	if len(args) >= 1 && args[0] == "advance" {
		f := newDevFlags("dev advance")
		days := f.fs.Float64("days", 0, "how many days to move the clock on (may be fractional)")
		if code, done := parseFlagsTo(f.fs, devHelp, args[1:], stdout, stderr, true); done {
			return code
		}
		if *days <= 0 {
			fmt.Fprintln(stderr, "billing dev advance: --days must be above 0")
			devHelp.print(stderr, f.fs)
			return exitUsage
		}
		return devPost(dir, f, "/dev/advance", url.Values{"days": {strconv.FormatFloat(*days, 'f', -1, 64)}}, stdout, stderr)
	}
	f := newDevFlags("dev")
	if code, done := parseFlagsTo(f.fs, devHelp, args, stdout, stderr, false); done {
		return code
	}
	if f.fs.NArg() > 0 {
		fmt.Fprintf(stderr, "billing dev: unknown subcommand %q\n", strings.Join(f.fs.Args(), " "))
	}
	devHelp.print(stderr, f.fs)
	return exitUsage
}

// portalSessionID is the session of a portal URL (…/dev-portal/bps_…), or s itself. The binary
// does not link the dev Stripe's package (a test double), so the path is known here too.
func portalSessionID(s string) string {
	if _, id, ok := strings.Cut(s, "/dev-portal/"); ok {
		s = id
	}
	s, _, _ = strings.Cut(s, "?")
	return strings.Trim(s, "/")
}

// devStripeURL finds the dev Stripe: --stripe-url, the running make run's STRIPE_URL, or a
// loopback stripe.api_url of a test-mode configuration (never Stripe itself: /dev/ is not its).
func devStripeURL(dir string, f devFlags) (string, error) {
	if *f.stripeURL != "" {
		return *f.stripeURL, nil
	}
	env, _, err := runenv.Find(dir)
	if err == nil && env.StripeURL != "" {
		return env.StripeURL, nil
	}
	if err != nil && !errors.Is(err, runenv.ErrNotRunning) {
		return "", err
	}
	cfg, cerr := config.Load(*f.config)
	if cerr != nil {
		return "", cerr
	}
	if u, perr := url.Parse(cfg.Stripe.APIURL); perr == nil && cfg.Stripe.Mode == "test" && isLoopback(u.Hostname()) {
		return cfg.Stripe.APIURL, nil
	}
	return "", fmt.Errorf("%w, and stripe.api_url (%s) is not a dev Stripe on this machine: start `make run`, or pass --stripe-url", runenv.ErrNotRunning, cfg.Stripe.APIURL)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// devAnswer is the dev Stripe's answer (devstripe.DevResult), as far as it is printed.
type devAnswer struct {
	Now     time.Time `json:"now"`
	Session string    `json:"session"`
	Changes []struct {
		Subscription  string    `json:"subscription"`
		What          string    `json:"what"`
		Status        string    `json:"status"`
		Invoice       string    `json:"invoice"`
		InvoiceStatus string    `json:"invoice_status"`
		Usage         int64     `json:"usage"`
		At            time.Time `json:"at"`
	} `json:"changes"`
	Events []struct {
		EventID  string `json:"event_id"`
		Type     string `json:"type"`
		Status   int    `json:"status"`
		Attempts int    `json:"attempts"`
		Error    string `json:"error"`
	} `json:"events"`
	Error string `json:"error"`
}

func devPost(dir string, f devFlags, path string, form url.Values, stdout, stderr io.Writer) int {
	base, err := devStripeURL(dir, f)
	if err != nil {
		fmt.Fprintln(stderr, "billing dev: "+err.Error())
		return exitFailure
	}
	client := &http.Client{Timeout: 2 * time.Minute}
	resp, err := client.PostForm(strings.TrimRight(base, "/")+path, form)
	if err != nil {
		fmt.Fprintf(stderr, "billing dev: the dev Stripe at %s: %v\n", base, err)
		return exitFailure
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var a devAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		fmt.Fprintf(stderr, "billing dev: %s answered %d, not a dev Stripe's answer (is it the dev Stripe of make run?): %.200s\n", base, resp.StatusCode, body)
		return exitFailure
	}
	if resp.StatusCode >= 400 && len(a.Changes) == 0 {
		fmt.Fprintf(stderr, "billing dev: %s\n", a.Error)
		return exitFailure
	}
	fmt.Fprintf(stdout, "dev Stripe clock: %s\n", a.Now.UTC().Format(time.RFC3339))
	if len(a.Changes) == 0 {
		fmt.Fprintln(stdout, "nothing fell due")
	}
	for _, c := range a.Changes {
		line := fmt.Sprintf("%s %s: %s", c.Subscription, c.What, c.Status)
		switch {
		case c.Invoice != "" && c.Usage != 0:
			line += fmt.Sprintf(" (invoice %s %s, with %d units of usage)", c.Invoice, c.InvoiceStatus, c.Usage)
		case c.Invoice != "":
			line += fmt.Sprintf(" (invoice %s %s)", c.Invoice, c.InvoiceStatus)
		}
		fmt.Fprintf(stdout, "%s at %s\n", line, c.At.UTC().Format(time.RFC3339))
	}
	for _, e := range a.Events {
		switch {
		case e.Attempts == 0:
			fmt.Fprintf(stdout, "  %s %s not sent: %s\n", e.Type, e.EventID, e.Error)
		default:
			fmt.Fprintf(stdout, "  %s %s -> %d (%d attempts)\n", e.Type, e.EventID, e.Status, e.Attempts)
		}
	}
	if resp.StatusCode >= 400 {
		fmt.Fprintf(stderr, "billing dev: %s\n", a.Error)
		return exitFailure
	}
	return 0
}
