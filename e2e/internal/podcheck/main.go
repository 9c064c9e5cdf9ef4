// Command podcheck is run by the local-cluster tests inside a simulated pod:
// it proves that what a real pod gets works unchanged in the simulator:
// client-go's in-cluster config (ServiceAccount token, CA, service address)
// and Talos' in-cluster talosconfig (/var/run/secrets/talos.dev/config).
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "podcheck:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("in-cluster config: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes as %s: %w", os.Getenv("HOSTNAME"), err)
	}
	fmt.Printf("kubernetes: %d nodes\n", len(nodes.Items))
	c, err := client.New(ctx, client.WithDefaultConfig())
	if err != nil {
		return fmt.Errorf("talos client: %w", err)
	}
	defer c.Close()
	v, err := c.Version(ctx)
	if err != nil {
		return fmt.Errorf("talos version: %w", err)
	}
	fmt.Printf("talos: %s\n", v.Messages[0].Version.Tag)
	ro := "writable"
	if f, err := os.CreateTemp("/", "podcheck-"); err != nil {
		ro = "read-only"
	} else {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}
	tmp := "writable"
	if f, err := os.CreateTemp("/tmp", "podcheck-"); err != nil {
		tmp = "not writable: " + err.Error()
	} else {
		_ = f.Close()
	}
	fmt.Printf("uid %d, root filesystem %s, /tmp %s\n", os.Getuid(), ro, tmp)
	if len(os.Args) > 1 && os.Args[1] == "sleep" {
		<-ctx.Done()
	}
	return nil
}
