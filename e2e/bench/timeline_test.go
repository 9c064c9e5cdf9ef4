package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// svgElements parses the picture as XML (it must be well formed) and counts
// its elements by tag and class, and collects its texts.
func svgElements(t *testing.T, b []byte) (map[string]int, string) {
	t.Helper()

	counts := map[string]int{}

	var texts strings.Builder

	dec := xml.NewDecoder(bytes.NewReader(b))

	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}

		require.NoError(t, err, "the SVG is not well-formed XML")

		switch e := tok.(type) {
		case xml.StartElement:
			key := e.Name.Local
			for _, a := range e.Attr {
				if a.Name.Local == "class" {
					key += "." + a.Value
				}
			}

			counts[key]++
		case xml.CharData:
			texts.Write(e)
			texts.WriteString("\n")
		}
	}

	return counts, texts.String()
}

func TestSVGTimeline(t *testing.T) {
	bound := lowerBound(benchLatencies, 1, 1, 1, 0)
	tl := Timeline{
		Title: "3 < 4 & a title", Subtitle: "wall 10.0s",
		Start: at(0), End: at(10),
		Rows: []string{"cp-1", "worker-1", rowRunner},
		Steps: []Step{
			{Row: "cp-1", Kind: "APIServers", From: at(0.5), To: at(3), Critical: true, Label: "cp-1 APIServers"},
			{Row: "worker-1", Kind: "KubeProxy", From: at(1), To: at(2), Label: "worker-1 KubeProxy: <off the path>"},
			// 2 s after cp-1's end: a wait on the critical path, labelled.
			{Row: "worker-1", Kind: "Kubelets", From: at(5), To: at(7), Critical: true, Label: "worker-1 Kubelets"},
			// 0.2 s after: drawn, not labelled.
			{Row: "cp-1", Kind: "Kubelets", From: at(7.2), To: at(9), Critical: true, Label: "cp-1 Kubelets"},
			{Row: rowRunner, Kind: kindRunner, From: at(0.3), To: at(10), Label: "runner"},
			{Row: "not-a-row", Kind: "Kubelets", From: at(1), To: at(2), Critical: true},
		},
		Bound: &bound,
		Marks: []Mark{{At: at(3), Label: "APIServers"}, {At: at(9), Label: "Kubelets"}},
	}

	counts, texts := svgElements(t, svgTimeline(tl))

	assert.Equal(t, 1, counts["svg"])
	assert.Equal(t, 3, counts["rect.step critical"], "the critical steps of known rows, outlined")
	assert.Equal(t, 2, counts["rect.step"], "the others")
	assert.Equal(t, len(bound.Terms), counts["rect.bound"], "a segment per term of the bound")
	assert.Equal(t, 2, counts["path.gap"], "the two waits on the critical path")
	assert.Equal(t, 1, counts["text.gap-label"], "only the wait from 0.5 s is labelled")
	assert.Equal(t, 2, counts["line.mark"])
	assert.Contains(t, texts, "2.00s")
	assert.Contains(t, texts, "3 < 4 & a title", "text is escaped, and reads back as written")
	assert.Contains(t, texts, "worker-1 KubeProxy: <off the path> (1.00s)")
	assert.Contains(t, texts, "bound")
	for _, row := range []string{"cp-1", "worker-1", rowRunner} {
		assert.Contains(t, texts, row+"\n")
	}
}

func TestSVGTimelineOfNothing(t *testing.T) {
	counts, _ := svgElements(t, svgTimeline(Timeline{Title: "empty", Start: at(0), End: at(0)}))
	assert.Equal(t, 1, counts["svg"])
	assert.Zero(t, counts["rect.step"]+counts["rect.step critical"])
}

func TestCriticalGapsAfterABatch(t *testing.T) {
	rows := map[string]int{"a": 0, "b": 1, "c": 2}
	steps := []Step{
		// a batch: b starts before a ends, so no wait between them; the
		// frontier is b's end, 4 s.
		{Row: "a", From: at(0), To: at(3), Critical: true},
		{Row: "b", From: at(0.1), To: at(4), Critical: true},
		// off the path: neither a wait nor a frontier.
		{Row: "c", From: at(4), To: at(9)},
		{Row: "c", From: at(6), To: at(7), Critical: true},
	}

	got := criticalGaps(steps, rows)
	require.Len(t, got, 1)
	assert.Equal(t, gapLine{from: at(4), to: at(6), fromRow: "b", toRow: "c"}, got[0])
}

func TestTickStep(t *testing.T) {
	assert.InDelta(t, 1.0, tickStep(10), 0)
	assert.InDelta(t, 10.0, tickStep(102), 0)
	assert.InDelta(t, 15.0, tickStep(160), 0)
	assert.InDelta(t, 60.0, tickStep(700), 0)
}

func TestNodeOrder(t *testing.T) {
	set := map[string]bool{"worker-10": true, rowRunner: true, "worker-2": true, "cp-2": true, "cp-1": true, "worker-1": true}
	assert.Equal(t, []string{"cp-1", "cp-2", "worker-1", "worker-2", "worker-10", rowRunner}, nodeOrder(set))
}

func TestUpgradeTimeline(t *testing.T) {
	image := func(c string) api.Change {
		return api.Change{Component: c, From: "registry.k8s.io/" + c + ":" + fromVersion, To: "registry.k8s.io/" + c + ":" + toVersion}
	}
	plan := &api.Plan{Stages: []api.Stage{
		{Name: "APIServers", Nodes: []api.NodeStep{{Node: "cp-1", Role: api.RoleControlPlane, Changes: []api.Change{image(events.APIServer)}}}},
		{Name: "Skipped", Skipped: true, Nodes: []api.NodeStep{{Node: "cp-1"}}},
		{Name: "KubeProxy", Nodes: []api.NodeStep{{Node: "cp-1", Role: api.RoleControlPlane, Changes: []api.Change{image(events.KubeProxy)}}}},
		{Name: "Kubelets", Nodes: []api.NodeStep{
			{Node: "cp-1", Role: api.RoleControlPlane, Changes: []api.Change{image(events.Kubelet)}},
			{Node: "worker-1", Role: api.RoleWorker, Changes: []api.Change{image(events.Kubelet)}},
		}},
	}}
	tl := stageTimelines{
		"APIServers": {"cp-1": {applyStarted: at(1), done: at(5)}},
		"KubeProxy":  {"cp-1": {applyStarted: at(6), done: at(6.5)}},
		"Kubelets":   {"cp-1": {applyStarted: at(10), done: at(13)}, "worker-1": {applyStarted: at(14)}}, // not done: no bar
	}
	evs := []events.Event{
		{Time: at(3), Node: "cp-1", Component: events.APIServer, Version: toVersion},
		{Time: at(7), Node: "cp-1", Component: events.KubeProxy, Version: toVersion},
		{Time: at(8.5), Node: "worker-1", Component: events.KubeProxy, Version: toVersion},
		{Time: at(0), Node: "worker-1", Component: events.KubeProxy, Version: fromVersion}, // not the target
		{Time: at(12), Node: "cp-1", Component: events.Kubelet, Version: toVersion},
	}
	pods := []runnerPod{
		{RunnerPod: RunnerPod{Name: "r-1", Node: "worker-1"}, locked: at(0.5)},
		{RunnerPod: RunnerPod{Name: "r-2", Node: "cp-1"}, locked: at(15)},
	}
	ends := map[string]time.Time{"APIServers": at(4), "KubeProxy": at(9.5), "Kubelets": at(13)}

	got := upgradeTimeline(plan, tl, evs, pods, ends, at(0), at(20))

	assert.Equal(t, []string{"cp-1", "worker-1", rowRunner}, got.Rows)
	assert.Equal(t, []Mark{{At: at(4), Label: "APIServers"}, {At: at(9.5), Label: "KubeProxy"}, {At: at(13), Label: "Kubelets"}}, got.Marks)

	type bar struct {
		row, kind string
		from, to  float64
		critical  bool
	}

	var bars []bar
	for _, s := range got.Steps {
		bars = append(bars, bar{s.Row, s.Kind, s.From.Sub(t0).Seconds(), s.To.Sub(t0).Seconds(), s.Critical})
	}

	assert.Equal(t, []bar{
		// verified when its apiserver started at the target and got Ready (RL 1 s)
		{"cp-1", "APIServers", 1, 4, true},
		// off the critical path: the rollout is on it
		{"cp-1", "KubeProxy", 6, 6.5, false},
		// a kubelet verified when it started at the target
		{"cp-1", "Kubelets", 10, 12, true},
		// the rollout's pods, from their start less PS (0.3 s) to Ready
		{"cp-1", kindKubeProxyPod, 6.7, 8, true},
		{"worker-1", kindKubeProxyPod, 8.2, 9.5, true},
		// the runners, each from its lock to the next one's, the last to the end
		{rowRunner, kindRunner, 0.5, 15, false},
		{rowRunner, kindRunner, 15, 20, false},
	}, bars)
}

func TestPeerTimeline(t *testing.T) {
	lines := []peerLine{
		{at(0.1), "automatically detected the lowest Kubernetes version 1.36.3"},
		{at(0.2), "discovered controlplane nodes [\"127.1.0.10\"]"},
		{at(0.3), ` > "127.1.0.10": pre-pulling registry.k8s.io/kube-apiserver:v1.37.2`},
		{at(0.5), ` > "127.1.0.11": pre-pulling ghcr.io/siderolabs/kubelet:v1.37.2`},
		{at(0.7), `updating "kube-apiserver" to version "1.37.2"`},
		{at(0.8), ` > "127.1.0.10": starting update`},
		{at(1.0), ` > "127.1.0.10": machine configuration patched`},
		{at(1.1), ` > "127.1.0.10": waiting for kube-apiserver pod update`},
		{at(4.0), ` < "127.1.0.10": successfully updated`},
		{at(4.1), `updating kube-proxy to version "1.37.2"`},
		{at(4.2), ` > "127.1.0.10": starting update`},
		{at(4.6), `updating kubelet to version "1.37.2"`},
		{at(4.7), ` > "127.1.0.11": starting update`},
		{at(5.0), ` > "127.1.0.11": waiting for kubelet restart`},
		{at(8.0), ` < "127.1.0.11": successfully updated`},
		{at(8.1), `updating manifests`},
		{at(8.2), ` > processing manifest v1.ServiceAccount/kube-proxy`},
	}
	names := map[string]string{"127.1.0.10": "cp-1", "127.1.0.11": "worker-1"}

	got := peerTimeline(lines, names, at(0), at(10))

	assert.Equal(t, []string{"cp-1", "worker-1", rowCluster}, got.Rows)

	type bar struct {
		row, kind string
		from, to  float64
	}

	var bars []bar

	for _, s := range got.Steps {
		assert.True(t, s.Critical, "talosctl does one thing at a time: %s", s.Label)
		bars = append(bars, bar{s.Row, s.Kind, s.From.Sub(t0).Seconds(), s.To.Sub(t0).Seconds()})
	}

	assert.Equal(t, []bar{
		{"cp-1", kindPrePull, 0.3, 0.5},
		{"worker-1", kindPrePull, 0.5, 0.7},
		{"cp-1", "kube-apiserver", 0.8, 4},
		{"cp-1", "kube-proxy", 4.2, 4.6},
		{"worker-1", "kubelet", 4.7, 8},
		{rowCluster, kindManifests, 8.1, 10},
	}, bars)
}
