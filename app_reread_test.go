package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"billing/billing"
	"billing/config"
	"billing/internal/apitest"
	"billing/internal/testenv"
)

// The service's River client works the re-read jobs that billing queues: its worker is in the
// bundle, though it is added after the client is built (River refuses to insert a job of a kind
// it has no worker for).
func TestAppWorksRereadJobs(t *testing.T) {
	cfg, err := config.Load("")
	if err != nil {
		t.Fatal(err)
	}
	a, err := newApp(appOptions{Config: cfg, DB: testenv.DB(t), Logger: apitest.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	args := billing.RereadArgs{SubscriptionID: "sub_app", Due: time.Now().Unix()}
	_, err = a.River.Insert(context.Background(), args, &river.InsertOpts{ScheduledAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatalf("insert a re-read job: %v", err)
	}
	// The sweep that queues them is one of the client's periodic jobs, and has its worker.
	if _, err := a.River.Insert(context.Background(), billing.RereadSweepArgs{}, &river.InsertOpts{ScheduledAt: time.Now().Add(24 * time.Hour)}); err != nil {
		t.Fatalf("insert a sweep job: %v", err)
	}
}
