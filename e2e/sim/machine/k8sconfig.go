package machine

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
)

// The Kubernetes settings a machine derives its resources from, read through
// machinery's K8s*Config accessors: they answer from a component's own
// document (the Talos 1.14 layout) or from the v1alpha1 fields (Talos 1.13
// and configs upgraded from it), whichever the config has, so a node of
// either layout, or a mix, derives the same resources as Talos does.

// kubeletImage is the kubelet image the config asks for.
func kubeletImage(cfg config.Config) string {
	if k := cfg.K8sKubeletConfig(); k != nil {
		return k.Image()
	}

	return constants.KubeletImage + ":v" + constants.DefaultKubernetesVersion
}

// kubeletExtraArgs are the kubelet's extraArgs.
func kubeletExtraArgs(cfg config.Config) map[string][]string {
	if k := cfg.K8sKubeletConfig(); k != nil {
		return k.ExtraArgs()
	}

	return nil
}

// skipNodeRegistration reports the kubelet's skipNodeRegistration.
func skipNodeRegistration(cfg config.Config) bool {
	n := cfg.K8sNodeConfig()

	return n != nil && n.SkipNodeRegistration()
}

// proxyImage is the kube-proxy image, "" when kube-proxy is disabled.
func proxyImage(cfg config.Config) string {
	if p := cfg.K8sProxyConfig(); p != nil && p.Enabled() {
		return p.Image()
	}

	return ""
}

// clusterEndpoint is the control plane endpoint URL, "" when unset.
func clusterEndpoint(cfg config.Config) string {
	if c := cfg.K8sClusterConfig(); c != nil && c.ClusterEndpoint() != nil {
		return c.ClusterEndpoint().String()
	}

	return ""
}

// apiServerPort is the port the local kube-apiserver listens on.
func apiServerPort(cfg config.Config) int {
	if a := cfg.K8sAPIServerConfig(); a != nil && a.APIPort() != 0 {
		return a.APIPort()
	}

	return constants.DefaultControlPlanePort
}

// network is the cluster's network: pod and service CIDRs and DNS domain.
type network struct {
	PodCIDRs, ServiceCIDRs []string
	DNSDomain              string
}

func clusterNetwork(cfg config.Config) network {
	n := cfg.K8sNetworkConfig()
	if n == nil {
		return network{DNSDomain: constants.DefaultDNSDomain}
	}

	return network{PodCIDRs: prefixes(n.PodCIDRs()), ServiceCIDRs: prefixes(n.ServiceCIDRs()), DNSDomain: n.DNSDomain()}
}

func prefixes(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}

	return out
}

// dnsServiceIP is the cluster DNS Service's address: the tenth address of
// the first service CIDR, as Talos (and kubeadm) choose it.
func dnsServiceIP(n network) (string, error) {
	if len(n.ServiceCIDRs) == 0 {
		return "", fmt.Errorf("cluster DNS service IP: no service CIDR")
	}

	p, err := netip.ParsePrefix(strings.TrimSpace(n.ServiceCIDRs[0]))
	if err != nil {
		return "", fmt.Errorf("cluster DNS service IP: %w", err)
	}

	ip := p.Masked().Addr()
	for range 10 {
		ip = ip.Next()
	}

	if !p.Contains(ip) {
		return "", fmt.Errorf("cluster DNS service IP: %s is too small", p)
	}

	return ip.String(), nil
}
