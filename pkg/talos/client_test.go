package talos

import (
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const node = "10.0.0.11"

func TestClientCalls(t *testing.T) {
	f := &fakeNode{}
	c, _ := serve(t, f)

	t.Run("version", func(t *testing.T) {
		v, err := c.Version(t.Context(), node)
		require.NoError(t, err)
		assert.Equal(t, "v1.13.9", v)
	})

	t.Run("apply", func(t *testing.T) {
		res, err := c.Apply(t.Context(), node, []byte("version: v1alpha1\n"), true)
		require.NoError(t, err)
		assert.Equal(t, ApplyResult{
			Mode:     "NO_REBOOT",
			Details:  "Applied configuration without a reboot",
			Warnings: []string{"a warning"},
		}, res)

		assert.Equal(t, machine.ApplyConfigurationRequest_NO_REBOOT, f.apply.GetMode())
		assert.True(t, f.apply.GetDryRun())
		assert.Equal(t, "version: v1alpha1\n", string(f.apply.GetData()))
	})

	t.Run("boot id", func(t *testing.T) {
		id, err := c.BootID(t.Context(), node)
		require.NoError(t, err)
		assert.Equal(t, "2c8a5f5e-0000-4000-8000-000000000001", id)
	})

	t.Run("etcd members", func(t *testing.T) {
		members, err := c.EtcdMembers(t.Context(), node)
		require.NoError(t, err)
		assert.Equal(t, []EtcdMember{{ID: 1, Hostname: "cp-1"}, {ID: 2, Hostname: "cp-2", IsLearner: true}}, members)
	})
}

func TestPullImage(t *testing.T) {
	const ref = "registry.example.com:5000/mirror/kube-apiserver:v1.36.3"

	for _, tc := range []struct {
		name  string
		node  *fakeNode
		ns    ImageNamespace
		calls []string
		want  *common.ContainerdInstance
		err   string
	}{
		{
			name:  "image service, static pod image",
			node:  &fakeNode{imageService: true, legacyPull: true},
			ns:    NamespaceCRI,
			calls: []string{"ImageService.Pull " + ref},
			want:  &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_CRI},
		},
		{
			name:  "image service, kubelet image",
			node:  &fakeNode{imageService: true},
			ns:    NamespaceSystem,
			calls: []string{"ImageService.Pull " + ref},
			want:  &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_SYSTEM},
		},
		{
			name:  "older Talos: MachineService.ImagePull",
			node:  &fakeNode{legacyPull: true},
			ns:    NamespaceSystem,
			calls: []string{"MachineService.ImagePull NS_SYSTEM " + ref},
		},
		{
			name: "neither: unsupported",
			node: &fakeNode{},
			ns:   NamespaceCRI,
			err:  `node "10.0.0.11": pull ` + ref + `: the node's Talos API cannot pre-pull images`,
		},
		{
			name: "unknown namespace",
			node: &fakeNode{imageService: true},
			ns:   "k8s.io",
			err:  `unknown image namespace "k8s.io"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.node
			c, _ := serve(t, f)

			err := c.PullImage(t.Context(), node, tc.ns, ref)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)

				if tc.ns == NamespaceCRI {
					assert.ErrorIs(t, err, ErrPullUnsupported)
				}

				return
			}

			require.NoError(t, err)
			assert.Equal(t, tc.calls, f.recorded())

			if tc.want != nil {
				require.Len(t, f.pulls, 1)
				assert.Equal(t, tc.want.GetDriver(), f.pulls[0].GetContainerd().GetDriver())
				assert.Equal(t, tc.want.GetNamespace(), f.pulls[0].GetContainerd().GetNamespace())
			}
		})
	}
}

func TestUpgrade(t *testing.T) {
	const image = "factory.talos.dev/installer/abc123:v1.13.9"

	for _, tc := range []struct {
		name  string
		node  *fakeNode
		calls []string
		err   string
	}{
		{
			name: "lifecycle service, then reboot",
			node: &fakeNode{imageService: true, lifecycleService: true},
			calls: []string{
				"ImageService.Pull " + image,
				"LifecycleService.Upgrade " + image + "@sha256:pulled",
				"Reboot",
			},
		},
		{
			name:  "installer fails: no reboot",
			node:  &fakeNode{imageService: true, lifecycleService: true, exitCode: 1},
			calls: []string{"ImageService.Pull " + image, "LifecycleService.Upgrade " + image + "@sha256:pulled"},
			err: `node "10.0.0.11": upgrade to ` + image + `: the installer exited with code 1 ` +
				`(last output: installing; writing the boot loader)`,
		},
		{
			name:  "no lifecycle service: MachineService.Upgrade",
			node:  &fakeNode{imageService: true},
			calls: []string{"ImageService.Pull " + image, "MachineService.Upgrade " + image},
		},
		{
			name:  "no image service: MachineService.Upgrade",
			node:  &fakeNode{},
			calls: []string{"MachineService.Upgrade " + image},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.node
			c, _ := serve(t, f)

			err := c.Upgrade(t.Context(), node, image)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}

			assert.Equal(t, tc.calls, f.recorded())
		})
	}
}

func TestMachineConfig(t *testing.T) {
	c, st := serve(t, &fakeNode{})

	_, err := c.MachineConfig(t.Context(), node)
	require.ErrorContains(t, err, `node "10.0.0.11": read machine config:`)

	cfg := container.NewV1Alpha1(&v1alpha1.Config{
		ConfigVersion: "v1alpha1",
		MachineConfig: &v1alpha1.MachineConfig{
			MachineType:    "worker",
			MachineKubelet: &v1alpha1.KubeletConfig{KubeletImage: "ghcr.io/siderolabs/kubelet:v1.35.2"},
		},
	})
	require.NoError(t, st.Create(t.Context(), configres.NewMachineConfig(cfg)))

	got, err := c.MachineConfig(t.Context(), node)
	require.NoError(t, err)
	assert.Equal(t, "ghcr.io/siderolabs/kubelet:v1.35.2", got.K8sKubeletConfig().Image())

	persistent, err := c.PersistentMachineConfig(t.Context(), node)
	require.NoError(t, err)
	assert.Nil(t, persistent, "no persistent copy")

	require.NoError(t, st.Create(t.Context(), configres.NewMachineConfigWithID(cfg, configres.PersistentID)))

	persistent, err = c.PersistentMachineConfig(t.Context(), node)
	require.NoError(t, err)
	require.NotNil(t, persistent)
}

func TestManifests(t *testing.T) {
	c, st := serve(t, &fakeNode{})

	for id, names := range map[string][]string{
		"10-kube-proxy": {"kube-proxy"},
		"00-rbac":       {"system:bootstrappers", "system:nodes"},
	} {
		m := k8s.NewManifest(k8s.ControlPlaneNamespaceName, id)
		for _, name := range names {
			m.TypedSpec().Items = append(m.TypedSpec().Items, k8s.SingleManifest{Object: map[string]any{
				"apiVersion": "v1",
				"kind":       "ConfigMap",
				"metadata":   map[string]any{"name": name, "namespace": "kube-system"},
				"data":       map[string]any{"replicas": 3},
			}})
		}

		require.NoError(t, st.Create(t.Context(), m))
	}

	objects, err := c.Manifests(t.Context(), node)
	require.NoError(t, err)

	var names []string
	for _, o := range objects {
		names = append(names, o.GetName())
	}

	assert.Equal(t, []string{"system:bootstrappers", "system:nodes", "kube-proxy"}, names)
	assert.Equal(t, int64(3), objects[0].Object["data"].(map[string]any)["replicas"])
}
