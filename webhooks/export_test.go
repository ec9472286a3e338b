package webhooks

// TakeInlineSlot takes one of the inbox's inline slots, as an attempt in flight does, until
// release is called.
func (i *Inbox) TakeInlineSlot() (release func()) {
	i.inlineSlots <- struct{}{}
	return func() { <-i.inlineSlots }
}

// SetGroupLanes sets how many batches of group commit are applied at once.
func (i *Inbox) SetGroupLanes(n int) { i.commit.lanes = n }

// QueuedApplies is how many inline applies wait for a lane of group commit.
func (i *Inbox) QueuedApplies() int {
	i.commit.mu.Lock()
	defer i.commit.mu.Unlock()
	return len(i.commit.queue)
}

// InlineSlotsInUse is how many inline slots are taken.
func (i *Inbox) InlineSlotsInUse() int { return len(i.inlineSlots) }
