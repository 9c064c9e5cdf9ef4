package soak

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

func TestGenerateSameSeedSameSchedule(t *testing.T) {
	for _, seed := range []uint64{0, 1, 42, 1764700000} {
		a, b := Generate(seed), Generate(seed)
		require.Equal(t, a, b, "seed %d", seed)
		require.NotEmpty(t, a.Faults)
		for _, f := range a.Faults {
			assert.Less(t, f.At.Duration, window, "%s", f)
		}
	}
	assert.NotEqual(t, Generate(1), Generate(2), "another seed, another run")
	assert.Equal(t, SelfCheck(7), SelfCheck(7))
	assert.Equal(t, []Fault{{Kind: AllEtcdStopped}}, SelfCheck(7).Faults)
}

func readFixture(t *testing.T, name string) []events.Event {
	t.Helper()
	evs, err := events.Read(filepath.Join("testdata", name))
	require.NoError(t, err)
	return evs
}

var k8sRun = Run{
	Shape:          Shape{ControlPlanes: 1, Workers: 1},
	Scenario:       Scenario{Upgrade: Kubernetes, Talos: "v1.13.9", Kubernetes: "v1.35.4", To: "v1.36.3"},
	MaxUnavailable: 1,
}

func TestJudgeCleanRunPasses(t *testing.T) {
	out, problems := Judge(Facts{Run: k8sRun, Events: readFixture(t, "clean.jsonl"), Final: Final{Phase: "Succeeded"}})
	assert.Empty(t, problems)
	assert.Equal(t, Succeeded, out)

	out, problems = Judge(Facts{Run: k8sRun, Events: readFixture(t, "clean.jsonl"), Final: Final{Phase: "Succeeded"},
		Pauses: []Pause{{Stage: "Kubelets", Node: "worker-1", Reason: "drain timed out", Action: "kubectl ichor resume"}}})
	assert.Empty(t, problems)
	assert.Equal(t, PausedThenSucceeded, out)
}

func TestJudgeFindsViolations(t *testing.T) {
	run := k8sRun
	run.Shape.Workers = 2
	out, problems := Judge(Facts{Run: run, Events: readFixture(t, "violations.jsonl"), Final: Final{Phase: "Succeeded", CredentialsLeft: []string{"serviceaccount ichor-system/ichor-runner"}},
		Pauses: []Pause{{Reason: "drain timed out"}}})
	assert.Equal(t, Broken, out)
	all := strings.Join(problems, "\n")
	assert.Contains(t, all, "kubelet v1.36.3 on worker-1 is newer than apiserver v1.35.4")
	assert.Contains(t, all, "2 workers cordoned at once (worker-1, worker-2): maxUnavailable is 1")
	assert.Contains(t, all, "without a reason and an action")
	assert.Contains(t, all, "worker-2 kubelet runs nothing the events show at the end, not v1.36.3")
	assert.Contains(t, all, "runner credentials left")
}

func TestPersonCordonIsNotCounted(t *testing.T) {
	evs := readFixture(t, "violations.jsonl")
	w := Window{Node: "worker-2", From: evs[4].Time, To: evs[6].Time}
	problems := CheckEvents(Run{Shape: Shape{1, 2}, Scenario: k8sRun.Scenario, MaxUnavailable: 1}, evs, []Window{w})
	assert.NotContains(t, strings.Join(problems, "\n"), "workers cordoned at once")
}

func TestSelfCheckMustPause(t *testing.T) {
	run := SelfCheck(3)
	out, _ := Judge(Facts{Run: run, Pauses: []Pause{{Reason: "etcd is not healthy", Action: "talosctl etcd status"}}, Final: Final{Phase: "Paused"}})
	assert.Equal(t, PausedAsExpected, out)
	out, problems := Judge(Facts{Run: run, Final: Final{Phase: "Succeeded"}})
	assert.Equal(t, Broken, out)
	assert.Contains(t, strings.Join(problems, "\n"), "not Paused")
}

func TestGenerateFitsFaultsToTheRun(t *testing.T) {
	seen := map[Kind]bool{}
	for seed := range uint64(2000) {
		r := Generate(seed)
		cps := r.Shape.Nodes()[:r.Shape.ControlPlanes]
		for _, f := range r.Faults {
			seen[f.Kind] = true
			switch {
			case f.Kind.ClusterWide():
				assert.Empty(t, f.Node, "seed %d: %s", seed, f)
			case f.Kind == EtcdStopped || f.Kind == EtcdAlarm:
				assert.Contains(t, cps, f.Node, "seed %d: %s on a control plane", seed, f)
			default:
				assert.Contains(t, r.Shape.Nodes(), f.Node, "seed %d: %s", seed, f)
			}
			if f.Kind == PDBBlocking {
				assert.Positive(t, r.Shape.Workers, "seed %d: the workload's budget exists only with workers", seed)
			}
			if f.Kind == EtcdStopped {
				assert.GreaterOrEqual(t, r.Shape.ControlPlanes, 3, "seed %d: one etcd stopped of three keeps quorum", seed)
			}
			if f.Kind == TalosStreamReset {
				assert.True(t, r.Scenario.Reboots(), "seed %d: the stream reset is the Upgrade call's", seed)
			}
		}
	}
	for _, k := range []Kind{RunnerKilled, RunnerEvicted, TalosUnavailable, TalosSlow, TalosStreamReset, NodeCordoned, SecondOperation,
		EtcdStopped, EtcdAlarm, NodeDrained, NodePoweredOff, APIServerRestart, StateWriteDenied, PDBBlocking, FollowerInterrupted,
		RunnerNodeDrained} {
		assert.True(t, seen[k], "no seed of 2000 draws %s", k)
	}
}

func TestNotAtTargetOfAPath(t *testing.T) {
	run := Run{Shape: Shape{ControlPlanes: 1, Workers: 1},
		Scenario: Scenario{Upgrade: Path, Talos: "v1.13.9", Kubernetes: "v1.36.3", To: "v1.14.1", ToKubernetes: "v1.37.2"}}
	var evs []events.Event
	at := func(node, component, version string) {
		evs = append(evs, events.Event{Node: node, Component: component, Version: version})
	}
	for _, n := range []string{"cp-1", "worker-1"} {
		at(n, events.Talos, "v1.14.1")
		at(n, events.Kubelet, "v1.37.2")
	}
	for _, c := range []string{events.APIServer, events.ControllerManager, events.Scheduler} {
		at("cp-1", c, "v1.37.2")
	}
	assert.Empty(t, NotAtTarget(run, evs))

	at("worker-1", events.Talos, "v1.13.9") // booted back: the A/B fallback
	assert.Equal(t, []string{"worker-1 talos runs v1.13.9 at the end, not v1.14.1"}, NotAtTarget(run, evs))

	talosOnly := run
	talosOnly.Scenario = Scenario{Upgrade: TalosOS, Talos: "v1.13.9", Kubernetes: "v1.36.3", To: "v1.14.1"}
	assert.Equal(t, []string{"worker-1 talos runs v1.13.9 at the end, not v1.14.1"}, NotAtTarget(talosOnly, evs),
		"a Talos upgrade judges Talos alone")
}
