package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func measured(nodes, mu int, wall float64, peer *PeerResult) UpgradeResult {
	r := UpgradeResult{
		Nodes: nodes, ControlPlanes: 3, Workers: nodes - 3, MaxUnavailable: mu, WallSeconds: wall,
		LowerBound: lowerBound(benchLatencies, 3, nodes-3, mu, 0), Talosctl: peer,
		KubernetesPerNode: 40, TalosPerNode: 10,
	}
	if peer != nil && peer.Error == "" {
		r.RatioToTalosctl = round(wall / peer.WallSeconds)
	}

	return r
}

func TestPeerVerdict(t *testing.T) {
	peer := &PeerResult{Command: "talosctl upgrade-k8s --to 1.37.2", WallSeconds: 160}
	failed := &PeerResult{Command: "talosctl upgrade-k8s --to 1.37.2", Error: "exit status 1"}

	got := peerVerdict([]UpgradeResult{
		measured(23, 5, 100, peer),
		measured(23, 1, 120, peer), // 0.75 x: met
		measured(8, 1, 121, peer),  // 0.76 x: not met
		measured(5, 1, 50, failed),
		measured(5, 5, 50, nil), // no comparison run
	})

	assert.Equal(t, []string{
		"23 nodes, --max-unavailable 5: 0.62 x talosctl upgrade-k8s's wall (100.0s against 160.0s; the target is one worker at a time's)",
		"23 nodes, --max-unavailable 1: at most 0.75 x talosctl upgrade-k8s's wall: met (120.0s against 160.0s: 0.75 x)",
		"8 nodes, --max-unavailable 1: at most 0.75 x talosctl upgrade-k8s's wall: NOT met (121.0s against 160.0s: 0.76 x)",
		"5 nodes, --max-unavailable 1: against talosctl upgrade-k8s: not judged, the peer's run failed",
	}, got)
}

func TestUpgradeVerdictComparesRequestsBetweenRunsAlike(t *testing.T) {
	small, big := measured(8, 5, 60, nil), measured(23, 5, 90, nil)
	big.KubernetesPerNode = 50 // grew
	one := measured(23, 1, 130, nil)
	one.KubernetesPerNode = 500 // one at a time, one size: not judged, not held against the others

	got := upgradeVerdict([]UpgradeResult{small, big, one})

	assert.Contains(t, got, "--max-unavailable 5: Kubernetes requests per node not growing with the cluster: NOT met (40.0 at 8 nodes, 50.0 at 23 nodes)")
	assert.Contains(t, got, "--max-unavailable 5: Talos calls per node not growing with the cluster: met (10.0 at 8 nodes, 10.0 at 23 nodes)")
	assert.Contains(t, got, "--max-unavailable 1: requests per node not growing with the cluster: not judged, one size only")
}

func TestUpgradeReportCarriesThePeerBesideEachResult(t *testing.T) {
	peer := &PeerResult{Command: "talosctl upgrade-k8s --to 1.37.2", WallSeconds: 160, Timeline: "timeline-23-nodes-talosctl.svg"}
	r := UpgradeReport{Latencies: benchLatencies, MaxUnavailable: 5, Results: []UpgradeResult{measured(23, 5, 100, peer), measured(23, 1, 120, peer)}}
	r.Verdict = upgradeVerdict(r.Results)

	b, err := json.Marshal(r)
	require.NoError(t, err)

	var doc struct {
		Results []struct {
			MaxUnavailable  int     `json:"maxUnavailable"`
			WallSeconds     float64 `json:"wallSeconds"`
			RatioToTalosctl float64 `json:"ratioToTalosctl"`
			Talosctl        struct {
				WallSeconds float64 `json:"wallSeconds"`
			} `json:"talosctl"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Results, 2)
	assert.InDelta(t, 160.0, doc.Results[0].Talosctl.WallSeconds, 0)
	assert.InDelta(t, 160.0, doc.Results[1].Talosctl.WallSeconds, 0)
	assert.Equal(t, 1, doc.Results[1].MaxUnavailable)
	assert.InDelta(t, 0.75, doc.Results[1].RatioToTalosctl, 0)

	var text bytes.Buffer
	writeUpgradeSummary(&text, &r)
	assert.Contains(t, text.String(), "talosctl upgrade-k8s --to 1.37.2 at 23 nodes (an identical cluster, no drains, kubelets one at a time): 160.0s")
	assert.Equal(t, 1, bytes.Count(text.Bytes(), []byte("at 23 nodes (an identical cluster")), "the peer's run is said once per size")
	assert.Contains(t, text.String(), "at most 0.75 x talosctl upgrade-k8s's wall: met")
	assert.Regexp(t, `23 \(3\+20\)\s+1\s+\S+\s+120\.0s\s+\S+\s+\S+\s+160\.0s\s+0\.75`, text.String())
}
