package discovery

import (
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// NewTalos returns what a plan and the engine need of a node's Talos side:
// its version and what its active machine config says.
func NewTalos(version string, cfg config.Provider) *Talos {
	return talosFromConfig(version, cfg, render.Images)
}

// talosFromConfig extracts what the plan needs from a node's active machine config.
func talosFromConfig(version string, cfg config.Provider, images func(config.Provider) map[Component]string) *Talos {
	t := &Talos{
		Version:          version,
		Images:           images(cfg),
		InstallImage:     InstallImage(cfg),
		KubeProxyEnabled: cfg.K8sProxyConfig() != nil && cfg.K8sProxyConfig().Enabled(),
		APIAccess:        apiAccess(cfg),
		Config:           cfg,
	}

	t.Layouts = make(map[Component]render.Layout, len(t.Images))
	for c := range t.Images {
		t.Layouts[c] = render.LayoutOf(cfg, c)
	}

	return t
}

// InstallImage is the installer the config names, from whichever layout it
// uses: Talos 1.14's UnattendedInstallConfig document, else
// machine.install.image.
func InstallImage(cfg config.Provider) string {
	if u := cfg.UnattendedInstallConfig(); u != nil && u.InstallerImage() != "" {
		return u.InstallerImage()
	}

	if m := cfg.Machine(); m != nil && m.Install() != nil {
		return m.Install().Image()
	}

	return ""
}

// apiAccess reads the Talos API access from Kubernetes the config allows.
// The form a patch should take follows the config: the v1alpha1 feature
// when the config sets it (Talos refuses both forms at once), the document
// when the config has it or keeps its Kubernetes settings in documents.
func apiAccess(cfg config.Provider) TalosAPIAccess {
	a := TalosAPIAccess{Document: cfg.Has(k8s.KubeTalosAPIAccessConfig)}

	if !a.Document {
		legacy := false
		if raw := cfg.RawV1Alpha1(); raw != nil && raw.MachineConfig != nil && raw.MachineConfig.MachineFeatures != nil {
			legacy = raw.MachineConfig.MachineFeatures.KubernetesTalosAPIAccessConfig != nil
		}

		a.Document = !legacy && cfg.Has(k8s.KubeletConfig)
	}

	if access := cfg.K8sTalosAPIAccessConfig(); access != nil {
		a.Enabled = true
		a.AllowedRoles = access.AllowedRoles()
		a.AllowedNamespaces = access.AllowedKubernetesNamespaces()
	}

	return a
}
