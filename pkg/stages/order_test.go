package stages_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

func node(name string, cp bool, mods ...func(*discovery.Node)) discovery.Node {
	n := discovery.Node{Name: name, ControlPlane: cp}
	for _, m := range mods {
		m(&n)
	}

	return n
}

func order(v string) func(*discovery.Node) { return func(n *discovery.Node) { n.Order = v } }

func held(n *discovery.Node) { n.Held, n.HoldReason = true, "maintenance" }

func names(nodes []discovery.Node) []string {
	out := []string{}
	for _, n := range nodes {
		out = append(out, n.Name)
	}

	return out
}

func TestOrderNodes(t *testing.T) {
	tests := []struct {
		name    string
		nodes   []discovery.Node
		opts    stages.OrderOptions
		cps     []string
		workers [][]string
		held    []string
		done    []string
		wantErr string
	}{
		{
			name:    "by name, one worker at a time",
			nodes:   []discovery.Node{node("w-b", false), node("cp-2", true), node("w-a", false), node("cp-1", true)},
			cps:     []string{"cp-1", "cp-2"},
			workers: [][]string{{"w-a"}, {"w-b"}},
		},
		{
			name: "batches of maxUnavailable",
			nodes: []discovery.Node{
				node("w-1", false), node("w-2", false), node("w-3", false), node("w-4", false), node("w-5", false),
			},
			opts:    stages.OrderOptions{MaxUnavailable: 2},
			cps:     []string{},
			workers: [][]string{{"w-1", "w-2"}, {"w-3", "w-4"}, {"w-5"}},
		},
		{
			name: "order label first ascending, then name",
			nodes: []discovery.Node{
				node("cp-1", true), node("cp-2", true, order("2")), node("cp-3", true, order("-1")),
				node("w-1", false), node("w-2", false, order("10")), node("w-3", false, order("9")),
			},
			cps:     []string{"cp-3", "cp-2", "cp-1"},
			workers: [][]string{{"w-3"}, {"w-2"}, {"w-1"}},
		},
		{
			name:    "held excluded and shown",
			nodes:   []discovery.Node{node("cp-1", true), node("cp-2", true, held), node("w-1", false, held), node("w-2", false)},
			cps:     []string{"cp-1"},
			workers: [][]string{{"w-2"}},
			held:    []string{"cp-2", "w-1"},
		},
		{
			name:    "self last in its group, even before the order label",
			nodes:   []discovery.Node{node("cp-1", true, order("1")), node("cp-2", true), node("cp-3", true), node("w-1", false)},
			opts:    stages.OrderOptions{Self: "cp-1"},
			cps:     []string{"cp-2", "cp-3", "cp-1"},
			workers: [][]string{{"w-1"}},
		},
		{
			name:    "self worker in the last batch",
			nodes:   []discovery.Node{node("w-1", false), node("w-2", false), node("w-3", false)},
			opts:    stages.OrderOptions{Self: "w-1", MaxUnavailable: 2},
			cps:     []string{},
			workers: [][]string{{"w-2", "w-3"}, {"w-1"}},
		},
		{
			name:    "already at target shown apart",
			nodes:   []discovery.Node{node("cp-1", true), node("cp-2", true), node("w-1", false), node("w-2", false)},
			opts:    stages.OrderOptions{Done: func(n discovery.Node) bool { return n.Name == "cp-2" || n.Name == "w-1" }},
			cps:     []string{"cp-1"},
			workers: [][]string{{"w-2"}},
			done:    []string{"cp-2", "w-1"},
		},
		{
			name:    "bad order label names the node",
			nodes:   []discovery.Node{node("cp-1", true), node("w-7", false, order("first"))},
			wantErr: `node "w-7": label ichor.dev/order="first" is not an integer`,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := stages.OrderNodes(tt.nodes, tt.opts)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)

				return
			}

			require.NoError(t, err)
			assert.Equal(t, tt.cps, names(got.ControlPlanes), "control planes")

			workers := [][]string{}
			for _, b := range got.Workers {
				workers = append(workers, names(b))
			}

			if tt.workers == nil {
				tt.workers = [][]string{}
			}

			assert.Equal(t, tt.workers, workers, "workers")

			if tt.held == nil {
				tt.held = []string{}
			}

			if tt.done == nil {
				tt.done = []string{}
			}

			assert.Equal(t, tt.held, names(got.Held), "held")
			assert.Equal(t, tt.done, names(got.Done), "done")
		})
	}
}
