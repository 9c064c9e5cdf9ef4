package kube

import (
	"context"
	"slices"
	"sync"

	"k8s.io/client-go/kubernetes"
)

// Observer is Observe shared by callers that read at the same time, each read as fresh
// as a caller's own: a caller gets a read that started after it called, and the callers
// that call while a read is under way share the next one. The nodes of a batch, each
// reading the whole cluster right after its apply, so make one or two reads rather than
// one each: at a hundred nodes each read decodes some MiB of Nodes and pods. It is safe
// for concurrent use.
type Observer struct {
	ctx    context.Context
	client kubernetes.Interface

	mu sync.Mutex
	// reading says a read is under way.
	reading bool
	// next is the read the callers waiting for one that starts after they called share;
	// nil when none waits.
	next *observation
}

// observation is one read, shared.
type observation struct {
	done    chan struct{}
	running []Running
	err     error
}

// NewObserver returns an Observer whose reads run under ctx (a caller that gives up
// leaves the read to the others that share it).
func NewObserver(ctx context.Context, client kubernetes.Interface) *Observer {
	return &Observer{ctx: ctx, client: client}
}

// Observe is Observe(ctx, client), from a read that started after the call. The slice
// is the caller's own.
func (o *Observer) Observe(ctx context.Context) ([]Running, error) {
	o.mu.Lock()

	obs := o.next
	if obs == nil {
		obs = &observation{done: make(chan struct{})}
		o.next = obs
	}

	if !o.reading {
		o.startLocked()
	}

	o.mu.Unlock()

	select {
	case <-obs.done:
		return slices.Clone(obs.running), obs.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startLocked starts the read of o.next; o.mu is held.
func (o *Observer) startLocked() {
	obs := o.next
	o.next, o.reading = nil, true

	go func() {
		obs.running, obs.err = Observe(o.ctx, o.client)
		close(obs.done)

		o.mu.Lock()
		defer o.mu.Unlock()

		o.reading = false
		if o.next != nil {
			o.startLocked()
		}
	}()
}
