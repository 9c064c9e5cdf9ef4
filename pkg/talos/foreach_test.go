package talos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// byName names a node given by its name.
func byName(name string) string { return name }

func TestForEachBound(t *testing.T) {
	for _, tc := range []struct {
		limit, nodes, wantMax int
	}{
		{limit: 1, nodes: 5, wantMax: 1},
		{limit: 2, nodes: 7, wantMax: 2},
		{limit: 10, nodes: 3, wantMax: 3},
		{limit: 0, nodes: 3, wantMax: 1},
	} {
		t.Run(fmt.Sprintf("limit %d of %d", tc.limit, tc.nodes), func(t *testing.T) {
			nodes := make([]string, tc.nodes)
			for i := range nodes {
				nodes[i] = fmt.Sprintf("10.0.0.%d", i+1)
			}

			var (
				running, peak atomic.Int32
				mu            sync.Mutex
				seen          []string
			)

			err := ForEach(t.Context(), nodes, byName, tc.limit, func(_ context.Context, node string) error {
				n := running.Add(1)
				defer running.Add(-1)

				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}

				time.Sleep(20 * time.Millisecond)

				mu.Lock()
				seen = append(seen, node)
				mu.Unlock()

				return nil
			})
			require.NoError(t, err)
			assert.Equal(t, int32(tc.wantMax), peak.Load())
			assert.ElementsMatch(t, nodes, seen)
		})
	}
}

func TestForEachJoinsErrors(t *testing.T) {
	nodes := []string{"cp-1", "cp-2", "cp-3", "w-1"}
	boom := errors.New("boom")

	err := ForEach(t.Context(), nodes, byName, 4, func(_ context.Context, node string) error {
		switch node {
		case "cp-3":
			// Finishes first, reported in node order all the same.
			return fmt.Errorf("verify: %w", boom)
		case "cp-1":
			time.Sleep(30 * time.Millisecond)

			return &NodeError{Node: "cp-1", Op: "apply", Err: boom}
		case "w-1":
			return &NodeError{Node: "elsewhere", Op: "apply", Err: boom}
		}

		return nil
	})

	require.Error(t, err)
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, `node "cp-1": apply: boom`+"\n"+
		`node "cp-3": verify: boom`+"\n"+
		`node "w-1": node "elsewhere": apply: boom`, err.Error())
}

func TestForEachStopsStartingOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())

	var started atomic.Int32

	err := ForEach(ctx, []string{"a", "b", "c", "d"}, byName, 1, func(ctx context.Context, node string) error {
		started.Add(1)

		if node == "b" {
			cancel()

			return ctx.Err()
		}

		return nil
	})

	assert.Equal(t, int32(2), started.Load())
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, `node "b": context canceled`+"\n"+`2 of 4 node(s) not started: context canceled`, err.Error())
}

func TestForEachNoNodes(t *testing.T) {
	require.NoError(t, ForEach(t.Context(), nil, byName, 2, func(context.Context, string) error {
		t.Fatal("called with no nodes")

		return nil
	}))
}
