package discovery

import (
	"github.com/siderolabs/talos/pkg/machinery/config"
)

// talosFromConfig extracts what the plan needs from a node's active machine config.
func talosFromConfig(version string, cfg config.Provider, images func(config.Provider) map[Component]string) *Talos {
	t := &Talos{
		Version:          version,
		Images:           images(cfg),
		InstallImage:     cfg.Machine().Install().Image(),
		KubeProxyEnabled: cfg.Cluster().Proxy().Enabled(),
		Config:           cfg,
	}

	if access := cfg.Machine().Features().KubernetesTalosAPIAccess(); access != nil {
		t.APIAccess = TalosAPIAccess{
			Enabled:           access.Enabled(),
			AllowedRoles:      access.AllowedRoles(),
			AllowedNamespaces: access.AllowedKubernetesNamespaces(),
		}
	}

	return t
}
