//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// TestTalosUpgradeOnce upgrades Talos 3+2 from v1.13.9 to v1.14.1 through the Job
// with every fault that used to cost a node a second install or a stuck operation:
// cp-2's Install call answers Unavailable after installing (the node stays up); the
// state ConfigMap refuses updates (a ValidatingAdmissionPolicy of the real apiserver)
// once cp-1 is done, until the runner has said why it stops; worker-1's Install call
// goes silent once installed and the runner is killed there, between the install and
// the reboot. It ends with every node on v1.14.1, installed exactly once (the
// simulator's talos-install events) and booted into it once.
func TestTalosUpgradeOnce(t *testing.T) {
	t.Parallel()
	testTalosUpgradeOnce(t, kube136, talos113, talos114)
}

// TestTalosUpgradeOnceLegacy is TestTalosUpgradeOnce from Talos v1.12.4, which has
// no LifecycleService: each node gets one MachineService.Upgrade call, which answers
// at once and drains, installs and reboots the node in the background. The faults
// as that call meets them: cp-2's call starts its sequence and answers Unavailable
// (the ack lost, the node still up: it reboots by itself); the state refuses
// updates once cp-1 is done; worker-1's sequence holds after its install, before
// its reboot, and the runner following it is killed there (the sequence then goes
// on by itself). It ends with every node on v1.13.9, installed exactly once and
// booted into it once.
func TestTalosUpgradeOnceLegacy(t *testing.T) {
	t.Parallel()
	testTalosUpgradeOnce(t, "v1.35.4", talosFrom, talosTo)
}

// testTalosUpgradeOnce upgrades Talos 3+2 from from to to (Kubernetes kube)
// through the Job with TestTalosUpgradeOnce's faults.
func testTalosUpgradeOnce(t *testing.T, kube, from, to string) {
	faults := filepath.Join(t.TempDir(), "faults.yaml")
	setFaults := func(doc string) {
		t.Helper()
		require.NoError(t, os.WriteFile(faults, []byte(doc), 0o644))
	}

	setFaults("nodes:\n  cp-2:\n    upgradeUnavailable: true\n  worker-1:\n    installHangs: true\n")

	c := startJobCluster(t, "--kubernetes", kube, "--talos", from, "--faults", faults)
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)

	start := time.Now()
	r := c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", to, "--yes", "--detach")
	r.requireExit(t, 0)

	installs := func() map[string]int {
		n := map[string]int{}

		for _, e := range c.Events(t) {
			if e.Component == events.TalosInstall {
				n[e.Node]++
			}
		}

		return n
	}

	// 1. The state refuses updates once cp-1 is done.
	eventually(t, 5*time.Minute, "cp-1 done", func(context.Context) error {
		if n := c.operation(t).Status.Node("cp-1"); n != nil && n.Phase == string(engine.PhaseDone) {
			return nil
		}

		return errors.New("not yet")
	})

	freezeState(t, c)
	t.Logf("%s: the state ConfigMap refuses updates", time.Now().Format("15:04:05.000"))

	frozenAt := installs()

	var said string

	eventually(t, 3*time.Minute, "the runner saying it cannot write the state", func(ctx context.Context) error {
		evs, err := c.Client.CoreV1().Events(jobNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}

		for _, e := range evs.Items {
			if e.Reason == "PauseNotRecorded" {
				said = e.Message

				return nil
			}
		}

		return errors.New("no PauseNotRecorded event yet")
	})

	t.Logf("the runner: %s", said)
	assert.Contains(t, said, "the state ConfigMap was not written within")
	assert.Contains(t, said, "frozen by the test")
	// An install whose mark was written just before the policy came in force may
	// still run; none runs twice, and none runs while its mark is refused.
	for node, n := range installs() {
		assert.LessOrEqual(t, n, 1, "installs of %s (at the freeze: %v)", node, frozenAt)
	}

	thawState(t, c)
	t.Logf("%s: the state ConfigMap takes updates again", time.Now().Format("15:04:05.000"))

	// The Job's next pod carries on; if the Job gave up meanwhile, the operator resumes.
	if op := c.operation(t); op.Status.Phase != api.PhaseRunning {
		c.ichor(t, 3*time.Minute, "resume", "--detach").requireExit(t, 0)
	}

	// 2. The runner dies between worker-1's install and its reboot: once worker-1's
	// machined says the install completed (its Install call stays silent meanwhile;
	// before Talos 1.13, its upgrade sequence holds before the reboot).
	worker1 := c.Machine(t, "worker-1").IP

	eventually(t, 8*time.Minute, "worker-1 installed", func(ctx context.Context) error {
		if installs()["worker-1"] == 0 {
			return errors.New("no install yet")
		}

		state, err := tc.InstallEvidence(ctx, worker1)
		if err != nil {
			return err
		}

		if state.State != talos.InstallDone && state.State != talos.InstallSequence {
			return fmt.Errorf("worker-1's machined log: %s", state)
		}

		return nil
	})

	holder := lockHolderPod(t, c)
	require.NotEmpty(t, holder)

	zero := int64(0)
	require.NoError(t, c.Client.CoreV1().Pods(jobNamespace).Delete(ctx, holder, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	t.Logf("%s: killed the runner %s between worker-1's install and its reboot", time.Now().Format("15:04:05.000"), holder)
	setFaults("nodes:\n  cp-2:\n    upgradeUnavailable: true\n")

	eventually(t, time.Minute, "the killed runner gone", func(ctx context.Context) error {
		p, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, holder, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded)) {
			return nil
		}

		return fmt.Errorf("pod %s still there (%v)", holder, err)
	})

	if r := c.ichor(t, 3*time.Minute, "resume", "--detach"); r.code != 0 {
		r.requireOneLineError(t, "nothing to resume")
	}

	r = c.ichor(t, 10*time.Minute, "status", "--watch")
	r.requireExit(t, 0)
	t.Logf("upgraded Talos 3+2 from %s to %s through the Job, with the faults, in %s", from, to, time.Since(start).Round(time.Millisecond))

	op := c.operation(t)
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)
	assert.GreaterOrEqual(t, op.Status.Runs, 2, "the killed runner had a successor")

	requireTalosAt(t, c, tc, to)
	requireNothingCordoned(t, c)

	evs := c.Events(t)
	assert.Equal(t, map[string]int{"cp-1": 1, "cp-2": 1, "cp-3": 1, "worker-1": 1, "worker-2": 1}, installs(), "one install per node")
	assert.ElementsMatch(t, []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}, eventNodes(talosStarts(evs, to)), "one boot into %s per node", to)
	assert.Empty(t, invariantBreaks(evs))

}

// freezeState makes the real apiserver refuse every update of the state ConfigMap, with
// a ValidatingAdmissionPolicy, and waits until it does.
func freezeState(t *testing.T, c *Cluster) {
	t.Helper()

	ctx := context.Background()
	deny := admissionv1.Deny
	fail := admissionv1.Fail

	_, err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "freeze-ichor-state"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf("object.metadata.name != '%s'", job.StateName),
				Message:    "the state is frozen by the test",
			}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	_, err = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "freeze-ichor-state"},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        "freeze-ichor-state",
			ValidationActions: []admissionv1.ValidationAction{deny},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	// In force once a dry-run update of the state is refused.
	eventually(t, time.Minute, "the policy in force", func(ctx context.Context) error {
		cm, err := c.Client.CoreV1().ConfigMaps(jobNamespace).Get(ctx, job.StateName, metav1.GetOptions{})
		if err != nil {
			return err
		}

		_, err = c.Client.CoreV1().ConfigMaps(jobNamespace).Update(ctx, cm, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "frozen by the test") {
			return nil
		}

		return fmt.Errorf("a dry-run update still passes (%v)", err)
	})
}

// thawState removes freezeState's policy.
func thawState(t *testing.T, c *Cluster) {
	t.Helper()

	ctx := context.Background()

	require.NoError(t, c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, "freeze-ichor-state", metav1.DeleteOptions{}))
	require.NoError(t, c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, "freeze-ichor-state", metav1.DeleteOptions{}))
}
