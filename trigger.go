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
		"EVENT_TYPE, every type the service handles (and customer.created, which it ignores):\n" +
		"  customer.subscription.created|updated|deleted|trial_will_end|paused|resumed\n" +
		"  invoice.payment_succeeded|paid|payment_failed|payment_action_required|finalized|updated|voided|marked_uncollectible\n" +
		"  customer.created|updated|deleted\n" +
		"  entitlements.active_entitlement_summary.updated (--features; --features-more says Stripe has more,\n" +
		"    which the service then reads from Stripe)\n" +
		"  checkout.session.completed|async_payment_succeeded|async_payment_failed|expired (--session, --user)\n" +
		"  payment_intent.succeeded|processing|payment_failed|canceled (--payment-intent, --order, --amount,\n" +
		"    --decline-code)\n" +
		"  charge.refunded (--charge, --payment-intent, --amount, --amount-refunded)\n" +
		"  refund.created|updated, charge.refund.updated (--refund, --order, --refund-id, --status)\n" +
		"Every event gets a new id unless --event-id is given (the same id again is a redelivery).\n" +
		"--customer, --subscription and --invoice name the objects, so that several events play the\n" +
		"lifecycle of one customer linked with PUT /v1/customers/{user_id}; --order and --refund-id are\n" +
		"the ids of POST /v1/charges and its refunds, which a PaymentIntent's or refund's metadata\n" +
		"carries, so its event settles that row; --api-version other than\n" +
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
	suffix := fs.String("id", "", "suffix of the objects' ids (default random): sub_<id>, cus_<id>, in_<id>, cs_test_<id>, pi_<id>, ch_<id>, re_<id>")
	eventID := fs.String("event-id", "", "the event's id (default a new evt_… every time; repeat one to redeliver)")
	customer := fs.String("customer", "", "the customer's id, e.g. the stripe_customer_id of PUT /v1/customers/{user_id} (default cus_<id>)")
	subscription := fs.String("subscription", "", "the subscription's id (default sub_<id>)")
	invoice := fs.String("invoice", "", "the invoice's id (default in_<id>)")
	status := fs.String("status", "", "the object's status in place of the type's usual one: the subscription's (customer.subscription.*: trialing, active, past_due, unpaid, canceled…), the invoice's, the session's, the PaymentIntent's or the refund's (pending, succeeded, failed…)")
	session := fs.String("session", "", "the Checkout Session's id (checkout.session.*; default cs_test_<id>)")
	user := fs.String("user", "", "the app's user id the Checkout Session names (client_reference_id and metadata user_id) and the PaymentIntent's metadata user_id (default none: the session's user is the one linked to --customer)")
	paymentIntent := fs.String("payment-intent", "", "the PaymentIntent's id (payment_intent.*, charge.refunded, refunds; default pi_<id>)")
	charge := fs.String("charge", "", "the charge's id (charge.refunded, refunds; default ch_<id>)")
	refund := fs.String("refund", "", "Stripe's refund id (refund.*, charge.refund.updated; default re_<id>)")
	order := fs.String("order", "", "metadata order_id of the PaymentIntent, charge or refund: the order_id of POST /v1/charges (default o_<id>)")
	refundID := fs.String("refund-id", "", "metadata refund_id of the refund: the refund_id of POST /v1/charges/{order_id}/refunds (default r_<id>)")
	amount := fs.Int64("amount", 2000, "the PaymentIntent's, charge's or refund's amount in the currency's smallest unit")
	amountRefunded := fs.Int64("amount-refunded", 0, "the charge's refunded amount (charge.refunded; default --amount, all of it)")
	declineCode := fs.String("decline-code", "", "the decline of payment_intent.payment_failed (default generic_decline)")
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
		Session: *session, UserID: *user, PaymentIntent: *paymentIntent, Charge: *charge, Refund: *refund,
		OrderID: *order, RefundID: *refundID, Amount: *amount, AmountRefunded: *amountRefunded, DeclineCode: *declineCode,
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
