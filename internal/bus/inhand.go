package bus

import "sync"

// InHand is the one "already in hand" guard of the consumers: the keys (task ids) of the work
// this instance is carrying. Nudges repeat — the publishers', the sweeper's, a decision's, Pub/Sub's
// redeliveries — and one for work already in hand is acked without reaching the document: its
// claim would find the work held, or, the holder's lease lapsed mid-flight, take it over and do
// the work a second time in the same process; and its transaction would contend with the
// holder's commits on the document, where under load stacked transactions keep it locked for
// everyone. The zero InHand is empty and ready for use by many goroutines.
type InHand struct {
	keys sync.Map
}

// Take records key as in hand, and reports false when it already was: the caller then acks.
func (g *InHand) Take(key string) bool {
	_, busy := g.keys.LoadOrStore(key, struct{}{})
	return !busy
}

// Delete ends key's time in hand; the caller that took it calls it when the work is done.
func (g *InHand) Delete(key string) { g.keys.Delete(key) }

// Holds reports whether key is in hand.
func (g *InHand) Holds(key string) bool {
	_, ok := g.keys.Load(key)
	return ok
}
