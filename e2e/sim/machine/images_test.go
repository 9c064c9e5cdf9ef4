package machine_test

import (
	"fmt"
	"os"
	"testing"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// The registries serve what they serve today: no generic installer from
// Talos 1.14, the Image Factory's installers of any schematic, the
// Kubernetes components of the versions machinery knows.
func TestPullServesWhatTheRegistriesPublish(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")

	for _, tc := range []struct {
		ref       string
		published bool
	}{
		{"ghcr.io/siderolabs/installer:v1.13.9", true},
		{"ghcr.io/siderolabs/installer:v1.12.4", true},
		{"ghcr.io/siderolabs/installer:v1.14.0", false},
		{"ghcr.io/siderolabs/installer:v1.14.1", false},
		{"ghcr.io/siderolabs/installer:v1.99.0", false},
		{"ghcr.io/siderolabs/installer:latest", false},
		{"registry.local:5000/siderolabs/installer:v1.13.9", true},
		{"registry.local:5000/siderolabs/installer:v1.14.1", false},
		{"factory.talos.dev/metal-installer/" + emptySchematic + ":v1.14.1", true},
		{"factory.talos.dev/metal-installer-secureboot/" + simSchematic + ":v1.14.1", true},
		{"factory.talos.dev/aws-installer/" + simSchematic + ":v1.13.9", true},
		{"factory.talos.dev/installer/" + simSchematic + ":v1.12.4", true},
		{"factory.talos.dev/metal-installer/" + simSchematic + ":v1.15.0", false},
		{"factory.talos.dev/metal-installer/not-a-schematic:v1.14.1", false},
		{"factory.talos.dev/image/" + simSchematic + ":v1.14.1", false},
		{"registry.k8s.io/kube-apiserver:v1.36.3", true},
		{"registry.k8s.io/kube-proxy:v1.37.2", true},
		{"registry.k8s.io/kube-scheduler:v1.99.0", false},
		{"registry.k8s.io/pause:3.10", true},
		{"ghcr.io/siderolabs/kubelet:v1.36.3", true},
		{"ghcr.io/siderolabs/kubelet:v1.99.0", false},
		{"registry.local:5000/kube-apiserver:v1.36.3", true},
		{"ghcr.io/ichor-dev/kubectl-ichor:v0.1.0", true},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			_, err := f.m.Pull(t.Context(), simmachine.NamespaceSystem, tc.ref)
			if tc.published {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)
		})
	}
}

// A reference nobody serves fails as Talos' ImageService fails it, with
// containerd's words; the fault takes any reference away, a repository with
// all its tags; what a node pulled before stays in its store.
func TestPullNotFoundAsTalosSaysIt(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	ctx := t.Context()

	const missing = "ghcr.io/siderolabs/installer:v1.14.1"
	_, err := f.m.Pull(ctx, simmachine.NamespaceSystem, missing)
	require.Error(t, err)
	assert.Equal(t, codes.NotFound, status.Code(err))
	assert.Equal(t, fmt.Sprintf(`error pulling image: failed to pull image %q: failed to resolve reference %q: %s: not found`, missing, missing, missing),
		status.Convert(err).Message())

	name, err := f.m.Pull(ctx, simmachine.NamespaceCRI, "busybox")
	require.NoError(t, err, "Docker Hub, which the simulator does not know: served")
	assert.Equal(t, "docker.io/library/busybox:latest", name, "named as containerd normalizes it")

	_, err = f.m.Pull(ctx, simmachine.NamespaceSystem, "Not A Reference")
	assert.Equal(t, codes.Unknown, status.Code(err))
	assert.Contains(t, err.Error(), `failed to parse image reference "Not A Reference": invalid reference format`)

	const factory = "factory.talos.dev/metal-installer/" + emptySchematic + ":v1.14.1"
	_, err = f.m.Pull(ctx, simmachine.NamespaceSystem, factory)
	require.NoError(t, err)

	require.NoError(t, os.WriteFile(f.faults, []byte("unpublished:\n  - "+factory+"\n  - registry.k8s.io/kube-proxy\n"), 0o644))
	_, err = f.m.Pull(ctx, simmachine.NamespaceSystem, factory)
	require.NoError(t, err, "pulled before: in the store")
	_, err = f.m.Pull(ctx, simmachine.NamespaceCRI, factory)
	assert.Equal(t, codes.NotFound, status.Code(err), "not in that namespace's store, and unpublished")
	for _, ref := range []string{"registry.k8s.io/kube-proxy:v1.36.3", "registry.k8s.io/kube-proxy:v1.37.2"} {
		_, err = f.m.Pull(ctx, simmachine.NamespaceCRI, ref)
		assert.Equal(t, codes.NotFound, status.Code(err), "every tag of an unpublished repository: %s", ref)
	}
	_, err = f.m.Pull(ctx, simmachine.NamespaceCRI, "registry.k8s.io/kube-apiserver:v1.36.3")
	require.NoError(t, err, "the others are still served")
}

// LifecycleService.Upgrade installs only an image already in the store, as
// Talos does; MachineService.Upgrade pulls it itself and says why it cannot.
func TestUpgradesNeedAnImageThatExists(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	ctx := t.Context()

	const image = "ghcr.io/siderolabs/installer:v1.13.9"
	err := f.m.StageUpgrade(ctx, simmachine.NamespaceSystem, image, nil)
	require.Error(t, err)
	assert.Equal(t, codes.Internal, status.Code(err))
	assert.Equal(t, fmt.Sprintf(`upgrade failed: installer image %q not found in containerd store: image %q: not found`, image, image), status.Convert(err).Message())
	assert.Empty(t, f.m.State().StagedVersion)
	assert.Contains(t, machinedLog(t, f.m), "starting upgrade: installer_image="+image, "machined logs the start before it looks")

	_, err = f.m.Pull(ctx, simmachine.NamespaceCRI, image)
	require.NoError(t, err)
	require.Error(t, f.m.StageUpgrade(ctx, simmachine.NamespaceSystem, image, nil), "pulled into another namespace")
	_, err = f.m.Pull(ctx, simmachine.NamespaceSystem, image)
	require.NoError(t, err)
	require.NoError(t, f.m.StageUpgrade(ctx, simmachine.NamespaceSystem, image, nil))
	assert.Equal(t, "v1.13.9", f.m.State().StagedVersion)

	const missing = "ghcr.io/siderolabs/installer:v1.14.1"
	g := newMachine(t, false, "")
	err = g.m.Upgrade(ctx, &machineapi.UpgradeRequest{Image: missing}, nil)
	require.Error(t, err)
	assert.Equal(t, codes.Unknown, status.Code(err))
	assert.Equal(t, fmt.Sprintf(`error validating installer image %q: failed to pull image %q: failed to resolve reference %q: %s: not found`, missing, missing, missing, missing),
		status.Convert(err).Message())
	assert.Empty(t, installEvents(t, g.events), "nothing installed")
}
