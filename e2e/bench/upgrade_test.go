package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

func TestLowerBound(t *testing.T) {
	tests := []struct {
		name                     string
		cps, workers, maxUnavail int
		want                     float64
	}{
		// 0.3 + 4 x 0.2 + 2 x 3 x 3 + 23 x 1.3 + (3 + 4) x 2 + 10.3
		{name: "3+20, 5 at a time", cps: 3, workers: 20, maxUnavail: 5, want: 73.3},
		// 0.3 + 0.8 + 18 + 8 x 1.3 + (3 + 1) x 2 + 10.3
		{name: "3+5, 5 at a time", cps: 3, workers: 5, maxUnavail: 5, want: 47.8},
		// a last batch of one worker is a batch
		{name: "3+6, 5 at a time", cps: 3, workers: 6, maxUnavail: 5, want: 51.1},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.InDelta(t, tc.want, lowerBound(benchLatencies, tc.cps, tc.workers, tc.maxUnavail).Seconds, 1e-9)
		})
	}
}

func TestGroupsMoveTheRunnersNodeLast(t *testing.T) {
	step := func(name, role string) api.NodeStep { return api.NodeStep{Node: name, Role: role} }
	s := api.Stage{Nodes: []api.NodeStep{
		step("cp-1", api.RoleControlPlane), step("cp-2", api.RoleControlPlane),
		step("w-1", api.RoleWorker), step("w-2", api.RoleWorker), step("w-3", api.RoleWorker),
	}}

	var got []string
	for _, g := range groups(s, "w-1", 2) {
		got = append(got, g.String())
	}

	assert.Equal(t, []string{"cp-1", "cp-2", "[w-2 w-3]", "w-1"}, got)
}
