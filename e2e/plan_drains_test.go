//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// TestPlanDrainPreview: a budget that allows no disruption and a pod with no
// controller, both on nodes the Kubelets stage drains, are named by `plan`
// (node and pod, in the table and in -o json) and make it exit 2; once they
// are gone the same plan runs.
func TestPlanDrainPreview(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", planFrom, "--talos", planTalos)
	ctx := context.Background()

	addWorkload(t, c, 2)

	// A second budget over the web pods that keeps both: no disruption allowed.
	minAvailable := intstr.FromInt32(2)
	_, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web-strict"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &minAvailable,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	eventually(t, time.Minute, "budget web-strict counted by the disruption controller", func(ctx context.Context) error {
		p, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "web-strict", metav1.GetOptions{})
		if err != nil {
			return err
		}

		if p.Status.ObservedGeneration != p.Generation || p.Status.ExpectedPods != 2 {
			return fmt.Errorf("status %+v", p.Status)
		}

		return nil
	})

	// A pod with no controller, bound to worker-2.
	_, err = c.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "debug"},
		Spec: corev1.PodSpec{
			NodeName:   "worker-2",
			Containers: []corev1.Container{{Name: "debug", Image: "busybox:1.37"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	webPods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	require.NoError(t, err)
	require.Len(t, webPods.Items, 2)

	t.Run("blockers refuse the plan, by node and pod", func(t *testing.T) {
		r := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		r.requireExit(t, 2)
		require.Contains(t, r.stderr, "plan refused by drains")

		require.Regexp(t, `(?m)^  worker-2\s+default/debug\s+BLOCKS\s+no-controller: `, r.stdout)

		for _, p := range webPods.Items {
			require.Regexp(t, `(?m)^  `+p.Spec.NodeName+`\s+default/`+p.Name+`\s+BLOCKS\s+budget: budget default/web-strict allows 0 disruptions now$`, r.stdout)
		}

		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultRefused, checks["drains"].result, checks["drains"].detail)
		require.Contains(t, checks["drains"].detail, "worker-2: default/debug (no-controller)")

		r = c.plugin(t, "plan", "kubernetes", "--to", planTo, "-o", "json")
		r.requireExit(t, 2)
		plan := decodePlan(t, r.stdout)
		require.False(t, plan.Runnable)

		blockers := map[string][]string{}
		evict := map[string]int{}

		for _, d := range plan.Drains {
			evict[d.Node] = d.Evict

			for _, b := range d.Blockers {
				blockers[d.Node] = append(blockers[d.Node], b.Kind+" "+b.Pod)
			}
		}

		require.Len(t, plan.Drains, 5, "every node is drained by the Kubelets stage")
		require.Contains(t, blockers["worker-2"], "no-controller default/debug")

		for _, p := range webPods.Items {
			require.Contains(t, blockers[p.Spec.NodeName], "budget default/"+p.Name)
			require.Positive(t, evict[p.Spec.NodeName], p.Spec.NodeName)
		}
	})

	t.Run("without them the plan runs", func(t *testing.T) {
		require.NoError(t, c.Client.PolicyV1().PodDisruptionBudgets("default").Delete(ctx, "web-strict", metav1.DeleteOptions{}))
		require.NoError(t, c.Client.CoreV1().Pods("default").Delete(ctx, "debug", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))

		eventually(t, time.Minute, "pod debug gone", func(ctx context.Context) error {
			_, err := c.Client.CoreV1().Pods("default").Get(ctx, "debug", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}

			return fmt.Errorf("still there (%v)", err)
		})

		r := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		r.requireExit(t, 0)

		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultOK, checks["drains"].result, checks["drains"].detail)
		// The web pods and the cluster's own (CoreDNS's) go; DaemonSets' and mirror pods stay.
		require.Regexp(t, `^5 nodes, [2-9] pods to evict; nothing blocks them$`, checks["drains"].detail)
	})
}
