// Command devstripe is the Stripe API of `make run`: the emulator of the tests
// (internal/stripeemu) in front of stripe-mock, with the dev product's hooks and an account's
// state (internal/devstripe), so that charges behave as in Stripe's test mode (pm_card_visa succeeds,
// pm_card_chargeDeclined… decline, 3-D Secure cards need authentication), portal sessions open a
// local page, and what the service creates is what it reads back. It is a separate program so
// that the service's binary never carries a double of Stripe.
//
//	go run ./cmd/devstripe --listen 127.0.0.1:12111 --upstream http://127.0.0.1:12112
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"billing/internal/devstripe"
	"billing/internal/stripeemu"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devstripe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:12111", "address to listen on (loopback when the host is empty)")
	upstream := fs.String("upstream", "", "base URL of stripe-mock (required)")
	wait := fs.Duration("wait", time.Minute, "how long to wait for stripe-mock to answer before giving up")
	webhookURL := fs.String("webhook-url", "", "the service's webhook endpoint, where the events of completed Checkouts and renewals go (none: not sent)")
	webhookSecret := fs.String("webhook-secret", "", "the endpoint's signing secret (whsec_…; the service's stripe.webhook_secrets.test)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: devstripe --upstream URL [--listen ADDR] [--webhook-url URL --webhook-secret WHSEC]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *upstream == "" {
		fmt.Fprintln(stderr, "devstripe: --upstream is required (the URL of stripe-mock)")
		return 2
	}
	if (*webhookURL == "") != (*webhookSecret == "") {
		fmt.Fprintln(stderr, "devstripe: --webhook-url and --webhook-secret go together (events are signed with the secret)")
		return 2
	}
	if err := waitFor(*upstream, *wait); err != nil {
		fmt.Fprintln(stderr, "devstripe: "+err.Error())
		return 1
	}
	p, stop, err := stripeemu.Listen(*listen, *upstream)
	if err != nil {
		fmt.Fprintln(stderr, "devstripe: "+err.Error())
		return 1
	}
	defer stop()
	// Customers, Checkout sessions, subscriptions, invoices and meter events are kept, so that
	// the service reads back what it created.
	dev := devstripe.NewDevStripe(p)
	if *webhookURL != "" {
		dev.Webhooks = &devstripe.WebhookSender{URL: *webhookURL, Secret: *webhookSecret}
	}
	// The default portal configuration of a Stripe account set up for the service: cancelling
	// allowed, so that `billing doctor` and serve's start-up checks pass offline as they do
	// against an account that `billing stripe setup` prepared.
	p.PortalConfigurations().Add(true, true, true)
	p.OnRequest(func(r stripeemu.Request) {
		line := fmt.Sprintf("%s %s %s -> %d", time.Now().Format(time.TimeOnly), r.Method, r.Path, r.Status)
		if r.Replayed {
			line += " (idempotent replay)"
		}
		if pm := r.Form.Get("payment_method"); pm != "" {
			line += " payment_method=" + pm
		}
		fmt.Fprintln(stdout, line)
	})
	fmt.Fprintf(stdout, "devstripe: Stripe API (test mode stand-in) at %s, in front of stripe-mock at %s\n", p.URL, *upstream)
	fmt.Fprintf(stdout, "devstripe: new customers pay with %s; other test cards: %s, and pm_card_threeDSecure2Required (authentication)\n",
		devstripe.DefaultCard, strings.Join([]string{"pm_card_chargeDeclined", "pm_card_chargeDeclinedInsufficientFunds", "pm_card_chargeDeclinedExpiredCard"}, ", "))
	fmt.Fprintf(stdout, "devstripe: portal sessions open %s/dev-portal/bps_…\n", devstripe.PortalBase(p))
	fmt.Fprintln(stdout, "devstripe: complete a Checkout session with `billing dev checkout complete cs_…`; move time on with `billing dev advance --days N`")
	fmt.Fprintf(stdout, "devstripe: plans %s (pro_monthly, $20/month), %s (pro_yearly), %s (team_monthly, $50/month), %s (team_yearly); promotion codes WELCOME20 (20%% off), TENOFF ($10 off)\n",
		devstripe.DevPricePro, devstripe.DevPriceProYearly, devstripe.DevPriceTeam, devstripe.DevPriceTeamYearly)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if *webhookURL != "" {
		fmt.Fprintf(stdout, "devstripe: events go to %s\n", *webhookURL)
		// The service learns the catalog from its events (it also lists it: billing reconcile).
		// It is starting meanwhile: each event is tried for up to two minutes.
		go func() {
			ds, err := dev.SendCatalog(ctx, 2*time.Minute)
			if err != nil {
				fmt.Fprintf(stderr, "devstripe: the catalog's events: %v\n", err)
				return
			}
			fmt.Fprintf(stdout, "devstripe: sent the catalog: %d product and price events\n", len(ds))
		}()
	} else {
		fmt.Fprintln(stdout, "devstripe: no --webhook-url: events are not sent")
	}

	<-ctx.Done()
	return 0
}

// waitFor polls stripe-mock until it answers, so that the first charge of a fresh `make run`
// does not meet a proxy whose upstream is still starting.
func waitFor(base string, limit time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(limit)
	for {
		resp, err := client.Get(strings.TrimRight(base, "/") + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stripe-mock at %s did not answer within %s: %v", base, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
