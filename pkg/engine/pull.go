package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// A pre-pull is bounded per node, not per stage: each node's pull has its own
// PullTimeout from the moment it starts, and at most PullConcurrency nodes pull
// at once. A stage of any size so finishes as long as every node pulls within
// its bound (one bound over a whole stage paused a 1000-node stage that was
// merely long); a node whose pull hangs is named with its image and the flag.

// pull is one image to pull on one node.
type pull struct {
	ref string
	ns  talos.ImageNamespace
}

// nodePulls are the images to pull on one node.
type nodePulls struct {
	name, ip string
	pulls    []pull
}

// node names the node, for talos.ForEach.
func (n nodePulls) node() string { return n.name }

// PullTimeoutError is the cause of a node's pull that did not finish within
// its bound (inside a *talos.NodeError naming the node and the image).
type PullTimeoutError struct {
	// After is the bound that ran out.
	After time.Duration
}

func (e *PullTimeoutError) Error() string {
	return fmt.Sprintf("not done within %s (the bound of one node's pull: --pull-timeout)", e.After)
}

// pullErr names node and ref on err, once: the Talos client's own error of the
// same call (named by the node's address) is replaced by its cause.
func pullErr(node, ref string, err error) error {
	op := "pull " + ref
	if ne, ok := errors.AsType[*talos.NodeError](err); ok && ne.Op == op {
		err = ne.Err
	}

	return &talos.NodeError{Node: node, Op: op, Err: err}
}

// pullOnNode pulls every image of n at once (the node waits for its slowest
// pull, not for their sum), all under one bound of timeout from now. It
// returns how many it pulled, and unsupported when the node cannot pre-pull
// (talos.ErrPullUnsupported: not an error, the caller skips the node). A
// failure is a *talos.NodeError naming the node by name and the image; a pull
// cut by the bound has a *PullTimeoutError as its cause.
func (e *Engine) pullOnNode(ctx context.Context, n nodePulls, timeout time.Duration) (pulled int, unsupported bool, err error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	errs := make([]error, len(n.pulls))

	var wg sync.WaitGroup

	for i, p := range n.pulls {
		wg.Go(func() { errs[i] = e.Talos.PullImage(pctx, n.ip, p.ns, p.ref) })
	}

	wg.Wait()

	for i, err := range errs {
		switch {
		case errors.Is(err, talos.ErrPullUnsupported):
			return 0, true, nil
		case err == nil:
		case ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded):
			// The node's own bound, whatever the call made of it (a gRPC
			// DeadlineExceeded, a cancelled stream).
			return 0, false, pullErr(n.name, n.pulls[i].ref, &PullTimeoutError{After: timeout})
		default:
			return 0, false, pullErr(n.name, n.pulls[i].ref, err)
		}
	}

	return len(n.pulls), false, nil
}

// pullNodes pulls on every node, at most limit nodes at once, each under its
// own bound of timeout (pullOnNode). A failing node does not stop the others;
// their errors are joined in the order of nodes. It returns how many images
// were pulled and how many nodes could not pre-pull.
func (e *Engine) pullNodes(ctx context.Context, nodes []nodePulls, limit int, timeout time.Duration) (pulled, unsupported int, err error) {
	var mu sync.Mutex

	err = talos.ForEach(ctx, nodes, nodePulls.node, limit, func(ctx context.Context, node nodePulls) error {
		n, skipped, err := e.pullOnNode(ctx, node, timeout)

		mu.Lock()
		pulled += n
		if skipped {
			unsupported++
		}
		mu.Unlock()

		return err
	})

	return pulled, unsupported, err
}

// pullingAhead is a pull ahead under way (a Kubernetes stage's images or a Talos
// group's installers, pulled while the work before them runs); nil is none.
type pullingAhead struct {
	done   chan struct{}
	cancel context.CancelFunc
}

// startPullAhead runs pull in the background under a context of its own.
func startPullAhead(ctx context.Context, pull func(ctx context.Context)) *pullingAhead {
	ctx, cancel := context.WithCancel(ctx)
	p := &pullingAhead{done: make(chan struct{}), cancel: cancel}

	go func() {
		defer close(p.done)

		pull(ctx)
	}()

	return p
}

// wait waits for the pulls to end.
func (p *pullingAhead) wait() {
	if p != nil {
		<-p.done
		p.cancel()
	}
}

// stop ends the pulls (the run stops) and waits for them.
func (p *pullingAhead) stop() {
	if p != nil {
		p.cancel()
		<-p.done
	}
}
