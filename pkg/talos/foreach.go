package talos

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ForEach calls fn for every item, at most limit at a time (limit < 1 means
// one at a time), and waits for all of them; node(item) names the item's node
// (its address or its name). A failing node does not stop the others; the
// errors are joined in the order of items, each naming its node (an error that
// already is a *NodeError for that node is kept as it is). Once ctx is done no
// further node is started, and the nodes left out are counted in the error.
func ForEach[T any](ctx context.Context, items []T, node func(T) string, limit int, fn func(ctx context.Context, item T) error) error {
	if limit < 1 {
		limit = 1
	}

	errs := make([]error, len(items))
	slots := make(chan struct{}, limit)

	var (
		wg         sync.WaitGroup
		notStarted int
	)

	for i, item := range items {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}

		// Checked after the wait too: a select picks at random among ready cases.
		if ctx.Err() != nil {
			notStarted = len(items) - i

			break
		}

		wg.Go(func() {
			defer func() { <-slots }()

			errs[i] = nameNode(node(item), fn(ctx, item))
		})
	}

	wg.Wait()

	if notStarted > 0 {
		errs = append(errs, fmt.Errorf("%d of %d node(s) not started: %w", notStarted, len(items), ctx.Err()))
	}

	return errors.Join(errs...)
}

// nameNode makes sure err names node.
func nameNode(node string, err error) error {
	if err == nil {
		return nil
	}

	if ne, ok := errors.AsType[*NodeError](err); ok && ne.Node == node {
		return err
	}

	return fmt.Errorf("node %q: %w", node, err)
}
