package webhooks

// TakeInlineSlot takes one of the inbox's inline slots, as an attempt in flight does, until
// release is called.
func (i *Inbox) TakeInlineSlot() (release func()) {
	i.inlineSlots <- struct{}{}
	return func() { <-i.inlineSlots }
}
