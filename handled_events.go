package main

import (
	"gorm.io/gorm"

	"billing/billing"
	"billing/catalog"
	"billing/checkout"
	"billing/customers"
	"billing/entitlements"
	"billing/ledger"
	"billing/webhooks"
)

// registerEventHandlers registers the handler of every Stripe event type the service handles.
// newApp calls it with the running services; handledEventTypes reads the same registrations, so
// the types `billing stripe setup` subscribes the endpoint to and `billing doctor` checks are the
// types the inbox handles.
func registerEventHandlers(reg *webhooks.Registry, subs *billing.Service, ents *entitlements.Service, sessions *checkout.Service, charges *ledger.Service, sold *catalog.Service) {
	subs.Register(reg)
	ents.Register(reg)
	sold.Register(reg)
	sessions.Register(reg)
	customers.Register(reg)
	charges.Register(reg)
}

// handledEventTypes lists the types registerEventHandlers registers, sorted. The services are built
// only to be registered: their handlers never run here, so no database connection is opened.
func handledEventTypes() []string {
	reg := webhooks.NewRegistry()
	db := &gorm.DB{Config: &gorm.Config{}}
	subs := billing.New(billing.Deps{DB: db})
	registerEventHandlers(reg, subs, entitlements.New(entitlements.Deps{DB: db, Billing: subs}), checkout.New(checkout.Deps{}), ledger.New(ledger.Deps{}),
		catalog.New(catalog.Deps{DB: db}))
	return reg.Types()
}
