package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"billing/config"
	"billing/internal/runenv"
	"billing/internal/stripeevents"
)

var triggerHelp = commandHelp{
	Usage: "billing trigger [flags] EVENT_TYPE",
	About: "Posts a correctly signed sample event to a running service: the local `stripe trigger`.\n" +
		"EVENT_TYPE: customer.subscription.created|updated|deleted|trial_will_end,\n" +
		"invoice.payment_succeeded|payment_failed, customer.created|updated,\n" +
		"entitlements.active_entitlement_summary.updated (--features; --features-more says Stripe has more,\n" +
		"which the service then reads from Stripe).\n" +
		"Every event gets a new id unless --event-id is given (the same id again is a redelivery).\n" +
		"--customer, --subscription and --invoice name the objects, so that several events play the\n" +
		"lifecycle of one customer linked with PUT /v1/customers/{user_id}; --api-version other than\n" +
		"the pinned " + stripeevents.APIVersion + " makes an event the service dead-letters.",
	Env: [][2]string{
		{config.ConfigEnv, "YAML configuration file (like --config), read for the webhook secret"},
		{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST", "secrets to sign test-mode events with (the first one)"},
		{"BILLING_STRIPE_WEBHOOK_SECRETS_LIVE", "the same for --live"},
		{"BILLING_HTTP_ADDR", "the service's listen address: trigger posts to its port on localhost"},
	},
}

// trigger posts a signed sample event to a running service: the local `stripe trigger`.
func trigger(args []string) int {
	fs := flag.NewFlagSet("trigger", flag.ContinueOnError)
	url := fs.String("url", triggerURL(), "webhook endpoint of the running service (default: BILLING_HTTP_ADDR's port on localhost, else the `make run` service's)")
	secret := fs.String("secret", "", "webhook secret to sign with (default: the first configured secret of the mode, else the running `make run` service's test secret)")
	live := fs.Bool("live", false, "send a live-mode event")
	suffix := fs.String("id", "", "suffix of the objects' ids (default random): sub_<id>, cus_<id>, in_<id>")
	eventID := fs.String("event-id", "", "the event's id (default a new evt_… every time; repeat one to redeliver)")
	customer := fs.String("customer", "", "the customer's id, e.g. the stripe_customer_id of PUT /v1/customers/{user_id} (default cus_<id>)")
	subscription := fs.String("subscription", "", "the subscription's id (default sub_<id>)")
	invoice := fs.String("invoice", "", "the invoice's id (default in_<id>)")
	status := fs.String("status", "", "the subscription's status (customer.subscription.*: trialing, active, past_due, unpaid, canceled…) or the invoice's (invoice.*)")
	quantity := fs.Int64("quantity", 1, "the subscription's seats (customer.subscription.*)")
	features := fs.String("features", "premium", "comma-separated lookup keys of the customer's active entitlements (entitlements.active_entitlement_summary.updated)")
	featuresMore := fs.Bool("features-more", false, "the summary's list has more than --features (the service reads every page from Stripe)")
	apiVersion := fs.String("api-version", stripeevents.APIVersion, "the event's api_version (another one is dead-lettered)")
	cfgPath := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	// The event type may stand anywhere among the flags (flag parsing stops at it, so parse on
	// after it).
	var types []string
	for {
		if code, done := parseFlags(fs, triggerHelp, args); done {
			return code
		}
		if fs.NArg() == 0 {
			break
		}
		types = append(types, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(types) != 1 {
		return usageError(fs, triggerHelp, "billing trigger: name one EVENT_TYPE")
	}
	typ := types[0]
	if *secret == "" {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, err.Error())
			return exitUsage
		}
		if s := cfg.WebhookSecrets(*live); len(s) > 0 {
			*secret = s[0]
		} else if e, _, err := runenv.Find(workDir()); err == nil && !*live {
			*secret = e.WebhookSecret
		}
	}
	if *secret == "" {
		fmt.Fprintln(os.Stderr, "billing trigger: no webhook secret: pass --secret or set BILLING_STRIPE_WEBHOOK_SECRETS_TEST")
		return exitUsage
	}
	if *suffix == "" {
		*suffix = "trig" + randomHex(8)
	}
	if *eventID == "" {
		*eventID = "evt_trig" + randomHex(12)
	}
	now := time.Now()
	payload, err := stripeevents.SampleWith(typ, stripeevents.SampleOptions{
		Suffix: *suffix, EventID: *eventID, Customer: *customer, Subscription: *subscription,
		Invoice: *invoice, Status: *status, APIVersion: *apiVersion, Now: now, Livemode: *live,
		Quantity: *quantity, Features: splitList(*features), FeaturesHaveMore: *featuresMore,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "billing trigger: "+err.Error())
		return exitUsage
	}
	req, err := http.NewRequest(http.MethodPost, *url, bytes.NewReader(payload))
	if err != nil {
		fmt.Fprintln(os.Stderr, "billing trigger: "+err.Error())
		return exitUsage
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(payload, *secret, now))
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "billing trigger: "+err.Error())
		return exitFailure
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	fmt.Printf("%s %s -> %d %s\n", typ, *eventID, resp.StatusCode, strings.TrimSpace(string(body)))
	if resp.StatusCode != http.StatusOK {
		return exitFailure
	}
	return 0
}

// splitList splits a comma-separated flag, dropping empty parts.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
