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
	"billing/internal/stripeevents"
)

// trigger posts a signed sample event to a running service: the local `stripe trigger`.
func trigger(args []string) int {
	fs := flag.NewFlagSet("trigger", flag.ContinueOnError)
	url := fs.String("url", "http://localhost:8080/webhooks/stripe", "webhook endpoint of the running service")
	secret := fs.String("secret", "", "webhook secret to sign with (default: the first configured secret of the mode)")
	live := fs.Bool("live", false, "send a live-mode event")
	suffix := fs.String("id", "", "suffix of the sample's ids (default random): sub_<id>, cus_<id>, in_<id>, evt_<id>")
	cfgPath := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: billing trigger [flags] EVENT_TYPE\n\nflags:")
		fs.PrintDefaults()
	}
	// Accept the event type before or after the flags.
	var typ string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		typ, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if typ == "" && fs.NArg() > 0 {
		typ = fs.Arg(0)
	}
	if typ == "" {
		fs.Usage()
		return exitUsage
	}
	if *secret == "" {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, err.Error())
			return exitUsage
		}
		if s := cfg.WebhookSecrets(*live); len(s) > 0 {
			*secret = s[0]
		}
	}
	if *secret == "" {
		fmt.Fprintln(os.Stderr, "billing trigger: no webhook secret: pass --secret or set BILLING_STRIPE_WEBHOOK_SECRETS_TEST")
		return exitUsage
	}
	if *suffix == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		*suffix = "trig" + hex.EncodeToString(b[:])
	}
	now := time.Now()
	payload, err := stripeevents.Sample(typ, *suffix, now, *live)
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
	fmt.Printf("%s %s -> %d %s\n", typ, "evt_"+*suffix, resp.StatusCode, strings.TrimSpace(string(body)))
	if resp.StatusCode != http.StatusOK {
		return exitFailure
	}
	return 0
}
