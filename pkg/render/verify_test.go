package render

import (
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVerify(t *testing.T) {
	before := generated(t, machine.TypeControlPlane, "1.35.2")

	for _, tc := range []struct {
		name    string
		after   func(t *testing.T) config.Provider
		allowed []Component
		paths   []string // nil: Verify passes
	}{
		{
			name:  "identical",
			after: func(t *testing.T) config.Provider { return reload(t, before) },
		},
		{
			name: "image tags, all allowed by default",
			after: func(t *testing.T) config.Provider {
				res, err := Render(before, Uniform("v1.36.3"))
				require.NoError(t, err)

				return res.Config
			},
		},
		{
			name: "an image tag not allowed",
			after: func(t *testing.T) config.Provider {
				res, err := Render(before, Versions{APIServer: "v1.36.3", Kubelet: "v1.36.3"})
				require.NoError(t, err)

				return res.Config
			},
			allowed: []Component{Kubelet},
			paths:   []string{"cluster.apiServer.image"},
		},
		{
			name: "image repository changed",
			after: func(t *testing.T) config.Provider {
				return patched(t, before, func(c *v1alpha1.Config) {
					c.ClusterConfig.APIServerConfig.ContainerImage = "evil.example.com/kube-apiserver:v1.36.3"
				})
			},
			paths: []string{`cluster.apiServer.image: repository changed from "registry.k8s.io/kube-apiserver" to "evil.example.com/kube-apiserver"`},
		},
		{
			name: "a non-image change in v1alpha1",
			after: func(t *testing.T) config.Provider {
				return patched(t, before, func(c *v1alpha1.Config) {
					c.ClusterConfig.ClusterNetwork.CNI = &v1alpha1.CNIConfig{CNIName: "none"}
					c.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.36.3"
				})
			},
			paths: []string{"cluster.network.cni.name"},
		},
		{
			name: "a map key with dots",
			after: func(t *testing.T) config.Provider {
				return patched(t, before, func(c *v1alpha1.Config) {
					if c.MachineConfig.MachineNodeLabels == nil {
						c.MachineConfig.MachineNodeLabels = map[string]string{}
					}

					c.MachineConfig.MachineNodeLabels["example.com/rack"] = "r1"
				})
			},
			paths: []string{`machine.nodeLabels["example.com/rack"]`},
		},
		{
			name: "a list element",
			after: func(t *testing.T) config.Provider {
				return patched(t, before, func(c *v1alpha1.Config) {
					c.ClusterConfig.ClusterNetwork.PodSubnet = []string{"10.99.0.0/16"}
				})
			},
			paths: []string{"cluster.network.podSubnets[0]"},
		},
		{
			name: "another document",
			after: func(t *testing.T) config.Provider {
				b, err := before.EncodeBytes()
				require.NoError(t, err)

				edited := strings.Replace(string(b), "auto: stable", "auto: \"off\"", 1)
				require.NotEqual(t, string(b), edited, "the generated config has a HostnameConfig with auto: stable")

				cfg, err := configloader.NewFromBytes([]byte(edited))
				require.NoError(t, err)

				return cfg
			},
			paths: []string{"HostnameConfig: auto"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Verify(before, tc.after(t), tc.allowed...)
			if tc.paths == nil {
				require.NoError(t, err)

				return
			}

			var changeErr *UnexpectedChangeError
			require.ErrorAs(t, err, &changeErr)
			assert.Equal(t, tc.paths, changeErr.Paths)
			assert.Contains(t, err.Error(), tc.paths[0])
			assert.Contains(t, err.Error(), "talosctl get machineconfig")
		})
	}
}
