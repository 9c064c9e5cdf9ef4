package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPlanVerdictJudgesEachSizeWithATarget(t *testing.T) {
	r := func(nodes int, wall, rss float64) Result {
		return Result{Nodes: nodes, Wall: Spread{Median: wall, Max: wall}, PeakRSSMiB: rss, KubernetesByRequest: map[string]int{"GET /api/v1/nodes": 1}}
	}

	got := verdict([]Result{r(5, 0.4, 80), r(1000, 2.0, 110), r(5000, 6.1, 290), {Nodes: 8000, Error: "ichor-sim up: failed"}})

	assert.Equal(t, []string{
		"wall time under 5s at 1000 nodes: met (median 2.00s, max 2.00s)",
		"peak memory under 150 MiB at 1000 nodes: met (110.0 MiB)",
		"wall time under 5s at 5000 nodes: NOT met (median 6.10s, max 6.10s)",
		"peak memory under 300 MiB at 5000 nodes: met (290.0 MiB)",
		"Kubernetes request kinds not growing with the node count: met (0 (1 kinds) at 5 nodes, 0 (1 kinds) at 1000 nodes, 0 (1 kinds) at 5000 nodes)",
	}, got)

	got = verdict([]Result{r(5, 0.4, 80)})
	assert.Contains(t, got, "the targets at 1000 nodes: not judged, not measured")
	assert.Contains(t, got, "the targets at 5000 nodes: not judged, not measured")
}
