package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// planRows runs the plan's checks of kind on snap, by name.
func planRows(t *testing.T, kind engine.Kind, snap *discovery.Snapshot, target string) map[string]api.Check {
	t.Helper()

	v, err := stages.ParseVersion(target)
	require.NoError(t, err)

	list := checks.Kubernetes()
	if kind == engine.KindTalos {
		list = checks.Talos()
	}

	rows := map[string]api.Check{}
	for _, r := range checks.Run(context.Background(), list, &checks.Input{Snapshot: snap, Target: v}) {
		rows[r.Name] = r
	}

	return rows
}

// TestPlanAndEngineAgree shows the plan's row and the engine's pause say the same for
// the same cluster: both ask pkg/compat's rules, so a refusal is one refusal, in the
// same words (the pause's reason is "checks: <row>: <detail>", its action the row's).
func TestPlanAndEngineAgree(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kind   engine.Kind
		spec   engine.FakeSpec
		target string
		check  string // the plan's row that refuses
		stage  string // where the engine pauses
		detail string
	}{
		{
			name: "a node's Talos minor machinery's tables do not know", kind: engine.KindKubernetes,
			spec:   engine.FakeSpec{ControlPlanes: 1, Kubernetes: "v1.35.4", Talos: "v1.15.0"},
			target: "v1.36.3", check: "talos pairing", stage: "APIServers",
			detail: "Talos 1.15 (on cp-1) is newer than this build knows",
		},
		{
			name: "a target Talos minor machinery's tables do not know", kind: engine.KindTalos,
			spec:   engine.FakeSpec{ControlPlanes: 1, Kubernetes: "v1.35.4", Talos: "v1.13.9"},
			target: "v1.15.0", check: "upgrade path", stage: "TalosOS",
			detail: "Talos 1.15 is newer than this build knows",
		},
		{
			name: "a target Talos that does not support the Kubernetes the cluster runs", kind: engine.KindTalos,
			spec:   engine.FakeSpec{ControlPlanes: 1, Workers: 1, Kubernetes: "v1.30.14", Talos: "v1.12.4"},
			target: "v1.13.9", check: "kubernetes on target", stage: "TalosOS",
			detail: "Talos v1.13.9 supports Kubernetes 1.31-1.36: Kubernetes v1.30.14",
		},
		{
			name: "a Kubernetes target the nodes' Talos does not support", kind: engine.KindKubernetes,
			spec:   engine.FakeSpec{ControlPlanes: 2, Kubernetes: "v1.35.4", Talos: "v1.11.5"},
			target: "v1.36.3", check: "talos pairing", stage: "APIServers",
			detail: "Talos v1.11.5 (on cp-1, cp-2) supports Kubernetes 1.29-1.34, not v1.36.3",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := engine.RunFake(t, tc.kind, tc.spec, tc.target)

			row := planRows(t, tc.kind, snap, tc.target)[tc.check]
			require.Equal(t, api.ResultRefused, row.Result, "plan row %q: %s", tc.check, row.Detail)
			assert.Contains(t, row.Detail, tc.detail)

			pause, ok := errors.AsType[*engine.PauseError](err)
			require.True(t, ok, "want a pause, got %v", err)
			assert.Equal(t, tc.stage, pause.Stage)
			assert.Equal(t, "checks: "+tc.check+": "+row.Detail, pause.Reason)
			assert.Equal(t, row.Action, pause.Action)
			assert.NotEmpty(t, pause.Action)
		})
	}
}

// TestPlanAndEngineAgreeOnAHeldControlPlane: a held control plane keeps its apiserver
// behind the target. No version rule judges a held node, in the plan or the engine (the
// plan's version rows pass, the engine's APIServers stage runs); the plan's invariant
// row warns that the upgrade stops before ControlPlaneComponents, which is where the
// engine pauses, with the same action.
func TestPlanAndEngineAgreeOnAHeldControlPlane(t *testing.T) {
	const target = "v1.36.3"

	snap, err := engine.RunFake(t, engine.KindKubernetes,
		engine.FakeSpec{ControlPlanes: 3, Kubernetes: "v1.35.4", Held: []string{"cp-3"}}, target)

	rows := planRows(t, engine.KindKubernetes, snap, target)
	for _, name := range []string{"version skew", "talos pairing"} {
		assert.Equal(t, api.ResultOK, rows[name].Result, "plan row %q: %s", name, rows[name].Detail)
	}

	inv := rows["invariant"]
	require.Equal(t, api.ResultWarn, inv.Result, inv.Detail)
	assert.Contains(t, inv.Detail, "held control plane cp-3 keeps its kube-apiserver behind v1.36.3: the upgrade stops before the ControlPlaneComponents stage")

	pause, ok := errors.AsType[*engine.PauseError](err)
	require.True(t, ok, "want a pause, got %v", err)
	assert.Equal(t, "ControlPlaneComponents", pause.Stage)
	assert.Contains(t, pause.Reason, "kube-apiserver v1.35.4 on cp-3")
	assert.Equal(t, inv.Action, pause.Action)
}
