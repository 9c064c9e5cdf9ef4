//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// TestJobPreExistingSkew gives a worker a kubelet newer than the apiservers before the
// upgrade: plan reports it as a warning of its invariant check (not a refusal), and the
// upgrade through the Job, which keeps it from growing and moves the apiservers first,
// runs to the end.
func TestJobPreExistingSkew(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	ctx := context.Background()

	tc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })

	patchMachineConfig(t, tc, c.Machine(t, "worker-1").IP, func(cfg *v1alpha1.Config) {
		cfg.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.36.3"
	})

	eventually(t, 2*time.Minute, "worker-1's kubelet at v1.36.3", func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		if err != nil {
			return err
		}

		if v := n.Status.NodeInfo.KubeletVersion; v != "v1.36.3" || !nodeReady(n) {
			return fmt.Errorf("kubelet %s, ready %t", v, nodeReady(n))
		}

		return nil
	})

	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)

	check := tableChecks(r.stdout)["invariant"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "skew already there: kubelet v1.36.3 on worker-1 (Node worker-1) is newer than kube-apiserver v1.35.4")

	tcount := openTalos(t, c)
	before := machineConfigs(t, c, tcount)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	requireUpgraded(t, c, tcount, before, "v1.36.3")
	requireNothingCordoned(t, c)

	// The only skew ever seen is worker-1's, there before the upgrade.
	for _, broken := range invariantBreaks(c.Events(t)) {
		assert.True(t, strings.Contains(broken, "kubelet v1.36.3 on worker-1 newer than apiserver v1.35.4"), broken)
	}
}
