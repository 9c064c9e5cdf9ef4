// Command podroutes is the CNI daemon of the kind node image built by
// hack/kind-image.sh, standing in for kindnetd (whose module the Go proxy
// does not serve). On its node it writes a CNI config (Debian's ptp and
// host-local plugins on the node's pod CIDR, with masquerading, and portmap)
// and keeps a route to every other node's pod CIDR through that node's
// InternalIP: kind's nodes share one Docker network, so no encapsulation is
// needed.
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const confTemplate = `{
  "cniVersion": "0.4.0",
  "name": "podroutes",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": true,
      "mtu": %d,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

func main() {
	node := os.Getenv("NODE_NAME")
	confDir := os.Getenv("CNI_CONF_DIR")
	if node == "" || confDir == "" {
		log.Fatal("podroutes: set NODE_NAME (the pod's spec.nodeName) and CNI_CONF_DIR")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	written := ""
	for {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			log.Printf("listing nodes: %v", err)
		}
		for i := range nodes.Items {
			n := &nodes.Items[i]
			if n.Spec.PodCIDR == "" {
				continue
			}
			if n.Name == node {
				if written != n.Spec.PodCIDR {
					if err := writeConf(confDir, n.Spec.PodCIDR); err != nil {
						log.Printf("writing the CNI config: %v", err)
						continue
					}
					written = n.Spec.PodCIDR
					log.Printf("CNI config written for %s", written)
				}
				continue
			}
			if err := route(n); err != nil {
				log.Printf("route to %s: %v", n.Name, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

func writeConf(dir, cidr string) error {
	mtu := 1500
	if l, err := netlink.LinkByName("eth0"); err == nil {
		mtu = l.Attrs().MTU
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".10-podroutes.conflist")
	if err := os.WriteFile(tmp, fmt.Appendf(nil, confTemplate, mtu, cidr), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "10-podroutes.conflist"))
}

func route(n *corev1.Node) error {
	_, dst, err := net.ParseCIDR(n.Spec.PodCIDR)
	if err != nil {
		return err
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		gw := net.ParseIP(a.Address)
		if gw == nil || (gw.To4() == nil) != (dst.IP.To4() == nil) {
			continue
		}
		return netlink.RouteReplace(&netlink.Route{Dst: dst, Gw: gw})
	}
	return fmt.Errorf("no InternalIP of the pod CIDR's family")
}
