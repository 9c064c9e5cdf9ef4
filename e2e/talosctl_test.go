//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// talosctl runs the real talosctl (built from Talos' own source by make
// cluster-bins, see hack/talosctl) against c.
func (c *Cluster) talosctl(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	bin := filepath.Join(env(t, "ICHOR_CLUSTER_BINS"), "talosctl")
	cmd := exec.CommandContext(ctx, bin, append([]string{"--talosconfig", c.Talosconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("talosctl %s: no end after %s: %w", strings.Join(args, " "), timeout, ctx.Err())
	}
	return out.String(), err
}

// The simulated machines answer Talos' own client, talosctl, as Talos does:
// resource names and aliases resolve (get machineconfig, members,
// staticpodstatus), the services list, and talosctl upgrade-k8s takes a
// cluster from Kubernetes 1.35 to 1.36, through its wait for each kubelet's
// restart (its Service destroyed, then created running and healthy).
func TestTalosctlAgainstALocalCluster(t *testing.T) {
	t.Parallel()
	c := startCluster(t, "--control-planes", "1", "--workers", "1", "--kubernetes", "v1.35.4", "--talos", "v1.13.9")
	cp, worker := c.Machine(t, "cp-1").IP, c.Machine(t, "worker-1").IP
	const short = time.Minute

	t.Run("version", func(t *testing.T) {
		out, err := c.talosctl(t, short, "-n", cp, "version")
		require.NoError(t, err, out)
		require.Contains(t, out, "Tag:         v1.13.9")
	})

	t.Run("get machineconfig", func(t *testing.T) {
		out, err := c.talosctl(t, short, "-n", cp, "get", "machineconfig")
		require.NoError(t, err, out)
		t.Log("\n" + out)
		require.Regexp(t, `config\s+MachineConfig\s+v1alpha1`, out)
		require.Regexp(t, `config\s+MachineConfig\s+persistent`, out)
	})

	t.Run("get members", func(t *testing.T) {
		out, err := c.talosctl(t, short, "-n", worker, "get", "members")
		require.NoError(t, err, out)
		t.Log("\n" + out)
		require.Regexp(t, `cluster\s+Member\s+cp-1\s+\d+\s+cp-1\s+controlplane\s+Talos \(v1\.13\.9\)\s+\["?`+regexp.QuoteMeta(cp), out)
		require.Regexp(t, `cluster\s+Member\s+worker-1\s+\d+\s+worker-1\s+worker\s+Talos \(v1\.13\.9\)`, out)
	})

	t.Run("service", func(t *testing.T) {
		eventually(t, 30*time.Second, "every service running and healthy", func(context.Context) error {
			out, err := c.talosctl(t, short, "-n", cp, "service")
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			for _, svc := range []string{"apid", "etcd", "kubelet", "machined", "trustd"} {
				if !regexp.MustCompile(`\s` + svc + `\s+Running\s+OK\s`).MatchString(out) {
					return fmt.Errorf("%s not Running OK:\n%s", svc, out)
				}
			}
			return nil
		})
		out, err := c.talosctl(t, short, "-n", worker, "service", "kubelet")
		require.NoError(t, err, out)
		t.Log("\n" + out)
		require.Regexp(t, `STATE\s+Running`, out)
		require.Regexp(t, `HEALTH\s+OK`, out)
	})

	t.Run("get staticpodstatus and machinestatus", func(t *testing.T) {
		eventually(t, time.Minute, "the static pods' statuses", func(context.Context) error {
			out, err := c.talosctl(t, short, "-n", cp, "get", "staticpodstatus")
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			for _, p := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				if !strings.Contains(out, "kube-system/"+p+"-cp-1") {
					return fmt.Errorf("no %s:\n%s", p, out)
				}
			}
			return nil
		})
		eventually(t, time.Minute, "the machine ready", func(context.Context) error {
			out, err := c.talosctl(t, short, "-n", cp, "get", "machinestatus", "-o", "yaml")
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			if !strings.Contains(out, "stage: running") || !strings.Contains(out, "ready: true") {
				return fmt.Errorf("not running and ready:\n%s", out)
			}
			return nil
		})
	})

	t.Run("upgrade-k8s", func(t *testing.T) {
		out, err := c.talosctl(t, 15*time.Minute, "-n", cp, "upgrade-k8s", "--to", "1.36.3")
		t.Log("\n" + out)
		require.NoError(t, err)
		for _, n := range []string{cp, worker} {
			require.Contains(t, out, fmt.Sprintf(" > %q: waiting for kubelet restart", n))
			require.Contains(t, out, fmt.Sprintf(" > %q: waiting for node update", n))
		}
		require.Contains(t, out, fmt.Sprintf(" < %q: successfully updated", cp))
		nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		for _, n := range nodes.Items {
			require.Equal(t, "v1.36.3", n.Status.NodeInfo.KubeletVersion, n.Name)
		}
		out, err = c.kubectl(t, "get", "pods", "-n", "kube-system", "-l", "tier=control-plane", "-o",
			"custom-columns=NAME:.metadata.name,IMAGE:.spec.containers[0].image")
		require.NoError(t, err, out)
		for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			require.Contains(t, lineWith(out, comp+"-cp-1"), "registry.k8s.io/"+comp+":v1.36.3")
		}
	})
}

// An unmodified talosctl v1.14.1 upgrades and reboots a simulated node to the
// end, as it does a Talos node: `talosctl upgrade` pulls the installer (the
// generic one of 1.14 does not exist, as on ghcr.io: refused before anything
// changed), installs it, drains the node, reboots it and follows the reboot
// by the machine's events until it runs and is ready on a new boot, then
// uncordons it; `talosctl reboot` follows a plain reboot the same way.
func TestTalosctlUpgradeAndReboot(t *testing.T) {
	t.Parallel()
	c := startCluster(t, "--control-planes", "1", "--workers", "1", "--kubernetes", "v1.35.4", "--talos", talos113)
	addWorkload(t, c, 1)
	worker := c.Machine(t, "worker-1").IP
	tc := openTalos(t, c)
	ctx := context.Background()
	const long = 5 * time.Minute

	bootID := func() string {
		t.Helper()
		id, err := tc.BootID(ctx, worker)
		require.NoError(t, err)
		return id
	}

	requireBackUncordoned := func(t *testing.T, version string) {
		t.Helper()
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		assert.False(t, n.Spec.Unschedulable, "talosctl uncordoned it")
		assert.True(t, nodeReady(n), "Ready")
		assert.Equal(t, "Talos ("+version+")", n.Status.NodeInfo.OSImage)
	}

	t.Run("upgrade with the generic installer of 1.14: it does not exist", func(t *testing.T) {
		before := bootID()
		out, err := c.talosctl(t, long, "-n", worker, "upgrade", "--image", "ghcr.io/siderolabs/installer:"+talos114)
		t.Log("\n" + out)
		require.Error(t, err)
		require.Contains(t, out, "not found")
		assert.Equal(t, before, bootID(), "nothing rebooted")
		requireBackUncordoned(t, talos113)
	})

	t.Run("upgrade with the factory installer", func(t *testing.T) {
		before := bootID()
		out, err := c.talosctl(t, long, "-n", worker, "upgrade", "--image", factory114)
		t.Log("\n" + out)
		require.NoError(t, err)
		assert.NotEqual(t, before, bootID(), "a new boot")
		v, err := tc.Version(ctx, worker)
		require.NoError(t, err)
		assert.Equal(t, talos114, v)
		eventually(t, time.Minute, "the Node on the new osImage", func(context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if n.Status.NodeInfo.OSImage != "Talos ("+talos114+")" {
				return fmt.Errorf("osImage %q", n.Status.NodeInfo.OSImage)
			}
			return nil
		})
		requireBackUncordoned(t, talos114)
	})

	t.Run("reboot", func(t *testing.T) {
		before := bootID()
		out, err := c.talosctl(t, long, "-n", worker, "reboot")
		t.Log("\n" + out)
		require.NoError(t, err)
		assert.NotEqual(t, before, bootID(), "a new boot")
		requireBackUncordoned(t, talos114)
	})
}
