//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// e2eSchematic is the Image Factory schematic worker-1 was installed from.
const e2eSchematic = "5a8a2c5d1c6e3b4f7a9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d"

// emptySchematic is Image Factory's empty schematic, whose installer is
// Talos 1.14's default.
const emptySchematic = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

// extensionsOf lists what a node's Talos reports it runs: "name version".
func extensionsOf(t *testing.T, tc *countingTalos, c *Cluster, node string) []string {
	t.Helper()

	in, err := tc.Installed(context.Background(), c.Machine(t, node).IP)
	require.NoError(t, err)

	out := []string{}
	for _, e := range in.Extensions {
		out = append(out, e.String())
	}

	return out
}

// A node moved to an Image Factory schematic (iscsi-tools, drbd) whose config
// still names the plain installer: the plan names the factory installer of
// its schematic for it, the upgrade installs that one, and the node comes
// back on the target with its extensions.
func TestTalosUpgradeKeepsSchematic(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct{ from, to string }{{talosFrom, talosTo}, {"v1.13.9", "v1.14.1"}} {
		t.Run(tc.from+" to "+tc.to, func(t *testing.T) {
			t.Parallel()
			keepsSchematic(t, tc.from, tc.to)
		})
	}
}

func keepsSchematic(t *testing.T, from, to string) {
	c := startJobCluster(t, "--talos", from,
		"--extensions", "worker-1=iscsi-tools@v0.2.0,drbd@9.2.14", "--schematic", "worker-1="+e2eSchematic)
	tc := openTalos(t, c)

	before := extensionsOf(t, tc, c, "worker-1")
	require.Equal(t, []string{"iscsi-tools v0.2.0", "drbd 9.2.14", "schematic " + e2eSchematic}, before)

	factory := "factory.talos.dev/metal-installer/" + e2eSchematic + ":" + to
	// A vanilla node's installer: the generic one, which Talos 1.14 no
	// longer publishes; from 1.14 Talos' default, the factory's of the empty
	// schematic.
	vanilla := "ghcr.io/siderolabs/installer:" + to
	if to == talos114 {
		vanilla = "factory.talos.dev/metal-installer/" + emptySchematic + ":" + to
	}

	r := c.ichor(t, 2*time.Minute, "plan", "talos", "--to", to)
	r.requireExit(t, 0)
	require.Contains(t, lineWith(r.stdout, "worker-1"), "installer "+factory+" (the node's schematic 5a8a2c5d1c6e (keeps iscsi-tools, drbd); its config names another installer)")
	require.Contains(t, lineWith(r.stdout, "worker-2"), "installer "+vanilla)

	j := c.ichor(t, 2*time.Minute, "plan", "talos", "--to", to, "-o", "json")
	j.requireExit(t, 0)

	var worker1 *api.NodeStep

	for _, n := range decodePlan(t, j.stdout).Stages[0].Nodes {
		if n.Node == "worker-1" {
			worker1 = &n
		} else {
			require.Equal(t, vanilla, n.Changes[1].To, n.Node)
		}
	}

	require.NotNil(t, worker1)
	assert.Equal(t, api.Change{
		Component: "installer", From: "ghcr.io/siderolabs/installer:" + from, To: factory,
		Reason: "the node's schematic 5a8a2c5d1c6e (keeps iscsi-tools, drbd); its config names another installer",
	}, worker1.Changes[1])
	assert.Equal(t, &api.Installed{Platform: "metal", Schematic: e2eSchematic, Extensions: []string{"iscsi-tools v0.2.0", "drbd 9.2.14"}}, worker1.Installed)

	start := time.Now()

	r = c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", to, "--yes", "--detach")
	r.requireExit(t, 0)

	r = c.ichor(t, 10*time.Minute, "status", "--watch")
	r.requireExit(t, 0)
	t.Logf("upgraded Talos on 3+2 from %s to %s in %s", from, to, time.Since(start).Round(time.Millisecond))

	requireTalosAt(t, c, tc, to)
	requireNothingCordoned(t, c)

	// The simulated node keeps them only when it was upgraded with the factory
	// installer of its schematic (the plain one drops them).
	assert.Equal(t, before, extensionsOf(t, tc, c, "worker-1"), "worker-1 kept its schematic and extensions")
}

// A node that runs system extensions without an Image Factory schematic: the
// installer that keeps them cannot be derived, so plan and upgrade refuse it
// in one line naming the node and the flag to pass, and nothing starts; an
// explicit installer that would drop them is refused too; with
// --drop-extensions for the node the operator decides, and the plain
// installer drops them, as on Talos.
func TestTalosUpgradeRefusesUnderivableInstaller(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--talos", talosFrom, "--extensions", "worker-2=nvidia-open-gpu-kernel-modules@570.148.08")
	tc := openTalos(t, c)

	want := `node "worker-2" runs system extensions (nvidia-open-gpu-kernel-modules) but no Image Factory schematic: the installer that keeps them cannot be derived: pass it with --installer-image worker-2=REPOSITORY:` + talosTo

	r := c.ichor(t, 2*time.Minute, "plan", "talos", "--to", talosTo)
	r.requireExit(t, 1)
	r.requireOneLineError(t, want)

	r = c.ichor(t, 2*time.Minute, "upgrade", "talos", "--to", talosTo, "--yes", "--detach")
	r.requireExit(t, 1)
	r.requireOneLineError(t, want)

	_, err := c.control().Get(context.Background())
	require.ErrorIs(t, err, job.ErrNoOperation, "no operation was launched")

	// The plain installer for every node is refused too: it would drop
	// worker-2's extension, and nobody said so for worker-2.
	image := "ghcr.io/siderolabs/installer:" + talosTo
	r = c.ichor(t, 2*time.Minute, "plan", "talos", "--to", talosTo, "--installer-image", image)
	r.requireExit(t, 1)
	r.requireOneLineError(t, `node "worker-2" runs nvidia-open-gpu-kernel-modules, which --installer-image `+image+` does not carry: the node would reboot without them: `+
		`pass one that does (--installer-image worker-2=REPOSITORY:`+talosTo+`), or accept losing them with --drop-extensions worker-2`)

	// The operator's explicit choice, said for the node, is respected.
	j := c.ichor(t, 2*time.Minute, "plan", "talos", "--to", talosTo, "--installer-image", image, "--drop-extensions", "worker-2", "-o", "json")
	j.requireExit(t, 0)

	for _, n := range decodePlan(t, j.stdout).Stages[0].Nodes {
		require.Equal(t, image, n.Changes[1].To, n.Node)
		if n.Node == "worker-2" {
			require.Equal(t, "--installer-image, with --drop-extensions: drops nvidia-open-gpu-kernel-modules", n.Changes[1].Reason, n.Node)
		} else {
			require.Equal(t, "--installer-image", n.Changes[1].Reason, n.Node)
		}
	}

	require.Equal(t, []string{"nvidia-open-gpu-kernel-modules 570.148.08"}, extensionsOf(t, tc, c, "worker-2"))

	// Upgraded with it, worker-2 boots without its extension, as a real node
	// would: the harm the refusal keeps from happening by accident.
	r = c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", talosTo, "--installer-image", image, "--drop-extensions", "worker-2", "--yes", "--detach")
	r.requireExit(t, 0)

	r = c.ichor(t, 10*time.Minute, "status", "--watch")
	r.requireExit(t, 0)

	requireTalosAt(t, c, tc, talosTo)
	assert.Empty(t, extensionsOf(t, tc, c, "worker-2"), "the plain installer dropped the extension")
}
