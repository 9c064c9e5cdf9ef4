package talos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Client talks to the Talos API of a cluster's nodes through the endpoints of
// one talosconfig context. It is safe for concurrent use.
type Client struct {
	c         *client.Client
	path      string
	context   string
	endpoints []string
}

// Open finds the talosconfig (see FindConfig), picks the context and
// endpoints, and returns a Client. It does not dial: the first call does.
// Errors: *NoTalosconfigError, *ContextError, or one that names the file.
func Open(ctx context.Context, opts Options) (*Client, error) {
	path, err := FindConfig(opts.ConfigPath)
	if err != nil {
		return nil, err
	}

	cfg, name, err := loadConfig(path, opts.Context)
	if err != nil {
		return nil, err
	}

	endpoints := opts.Endpoints
	if len(endpoints) == 0 {
		endpoints = cfg.Contexts[name].Endpoints
	}

	if len(endpoints) == 0 {
		return nil, fmt.Errorf("talosconfig %s: context %q has no endpoints: pass --talos-endpoints", path, name)
	}

	options := []client.OptionFunc{
		client.WithConfig(cfg),
		client.WithContextName(name),
		client.WithEndpoints(endpoints...),
	}
	if len(opts.DialOptions) > 0 {
		options = append(options, client.WithGRPCDialOptions(opts.DialOptions...))
	}

	c, err := client.New(ctx, options...)
	if err != nil {
		return nil, fmt.Errorf("talosconfig %s, context %q: %w", path, name, err)
	}

	return &Client{c: c, path: path, context: name, endpoints: endpoints}, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	return c.c.Close()
}

// ConfigPath returns the talosconfig file in use.
func (c *Client) ConfigPath() string { return c.path }

// ContextName returns the talosconfig context in use.
func (c *Client) ContextName() string { return c.context }

// Endpoints returns the endpoints the client dials.
func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Version returns the Talos version a node runs, such as "v1.13.9".
func (c *Client) Version(ctx context.Context, node string) (string, error) {
	resp, err := c.c.Version(client.WithNode(ctx, node))
	if err != nil {
		return "", nodeErr(node, "version", err)
	}

	if len(resp.GetMessages()) == 0 || resp.GetMessages()[0].GetVersion().GetTag() == "" {
		return "", nodeErr(node, "version", errors.New("the reply carries no version"))
	}

	return resp.GetMessages()[0].GetVersion().GetTag(), nil
}

// MachineConfig returns a node's active machine config (the COSI resource
// MachineConfigs.config.talos.dev/v1alpha1).
func (c *Client) MachineConfig(ctx context.Context, node string) (config.Provider, error) {
	return c.machineConfig(ctx, node, configres.ActiveID, "read machine config")
}

// PersistentMachineConfig returns the machine config a node has saved for
// its next boot (MachineConfigs.config.talos.dev/persistent). It differs from
// MachineConfig when a change was staged and waits for a reboot: compare
// their hashes to refuse such a node. It returns nil, nil when the node keeps
// no persistent copy.
func (c *Client) PersistentMachineConfig(ctx context.Context, node string) (config.Provider, error) {
	cfg, err := c.machineConfig(ctx, node, configres.PersistentID, "read persistent machine config")
	if err != nil && state.IsNotFoundError(err) {
		return nil, nil
	}

	return cfg, err
}

func (c *Client) machineConfig(ctx context.Context, node, id, op string) (config.Provider, error) {
	mc, err := safe.StateGetByID[*configres.MachineConfig](client.WithNode(ctx, node), c.c.COSI, id)
	if err != nil {
		return nil, nodeErr(node, op, err)
	}

	cfg := mc.Provider()
	if cfg == nil {
		return nil, nodeErr(node, op, errors.New("the resource holds no config"))
	}

	return cfg, nil
}

// ApplyResult is what Talos answered to an apply.
type ApplyResult struct {
	// Mode is the mode Talos chose, such as "NO_REBOOT".
	Mode string
	// Details is Talos's explanation, including the change it found.
	Details string
	// Warnings are the config validation warnings.
	Warnings []string
}

// Apply applies a machine config to a node in mode NO_REBOOT; with dryRun,
// Talos only checks it and says what would change. Talos refuses a change
// that needs a reboot. Give a control-plane apply its own generous deadline:
// it returns only after Talos has restarted the static pods.
func (c *Client) Apply(ctx context.Context, node string, cfg []byte, dryRun bool) (ApplyResult, error) {
	op := "apply"
	if dryRun {
		op = "apply (dry run)"
	}

	resp, err := c.c.ApplyConfiguration(client.WithNode(ctx, node), &machine.ApplyConfigurationRequest{
		Data:   cfg,
		Mode:   machine.ApplyConfigurationRequest_NO_REBOOT,
		DryRun: dryRun,
	})
	if err != nil {
		return ApplyResult{}, nodeErr(node, op, err)
	}

	if len(resp.GetMessages()) == 0 {
		return ApplyResult{}, nodeErr(node, op, errors.New("no reply"))
	}

	m := resp.GetMessages()[0]

	return ApplyResult{Mode: m.GetMode().String(), Details: m.GetModeDetails(), Warnings: m.GetWarnings()}, nil
}

// ImageNamespace is where on a node an image is pulled to.
type ImageNamespace string

const (
	// NamespaceCRI is the CRI containerd's k8s.io namespace: the static pods'
	// images (kube-apiserver, kube-controller-manager, kube-scheduler) and
	// kube-proxy.
	NamespaceCRI ImageNamespace = "cri"
	// NamespaceSystem is the system namespace: the kubelet's image and the
	// Talos installer.
	NamespaceSystem ImageNamespace = "system"
)

func (ns ImageNamespace) containerd() (*common.ContainerdInstance, error) {
	switch ns {
	case NamespaceCRI:
		return &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_CRI}, nil
	case NamespaceSystem:
		return &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_SYSTEM}, nil
	default:
		return nil, fmt.Errorf("unknown image namespace %q: want %q or %q", ns, NamespaceCRI, NamespaceSystem)
	}
}

// PullImage pulls an image on a node ahead of its use, with ImageService.Pull
// or, on a Talos without it, MachineService.ImagePull. When the node has
// neither the error wraps ErrPullUnsupported: skip the pre-pull.
func (c *Client) PullImage(ctx context.Context, node string, ns ImageNamespace, ref string) error {
	op := "pull " + ref

	if _, err := c.pull(ctx, node, ns, ref); err == nil || !IsUnimplemented(err) {
		return nodeErr(node, op, err)
	}

	inst, err := ns.containerd()
	if err != nil {
		return nodeErr(node, op, err)
	}

	//nolint:staticcheck // the deprecated call is the fallback for a Talos without ImageService.
	err = c.c.ImagePull(client.WithNode(ctx, node), inst.GetNamespace(), ref)
	if IsUnimplemented(err) {
		return nodeErr(node, op, fmt.Errorf("%w (%v)", ErrPullUnsupported, err))
	}

	return nodeErr(node, op, err)
}

// pull runs ImageService.Pull to its end and returns the image's name as the
// node reports it (the reference LifecycleService.Upgrade takes).
func (c *Client) pull(ctx context.Context, node string, ns ImageNamespace, ref string) (string, error) {
	inst, err := ns.containerd()
	if err != nil {
		return "", err
	}

	ctx, cancel := context.WithCancel(client.WithNode(ctx, node))
	defer cancel()

	stream, err := c.c.ImageClient.Pull(ctx, &machine.ImageServicePullRequest{Containerd: inst, ImageRef: ref})
	if err != nil {
		return "", err
	}

	name := ref

	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return name, nil
		}

		if err != nil {
			return "", err
		}

		if n := msg.GetName(); n != "" {
			name = n
		}
	}
}

// bootIDPath is where Linux exposes the current boot's random ID.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// BootID returns the ID of a node's current boot: it changes with every
// reboot, so it tells whether an upgrade has rebooted the node.
func (c *Client) BootID(ctx context.Context, node string) (string, error) {
	ctx, cancel := context.WithCancel(client.WithNode(ctx, node))
	defer cancel()

	r, err := c.c.Read(ctx, bootIDPath)
	if err != nil {
		return "", nodeErr(node, "read boot id", err)
	}

	b, err := io.ReadAll(r)

	if closeErr := r.Close(); err == nil {
		err = closeErr
	}

	if err != nil {
		return "", nodeErr(node, "read boot id", err)
	}

	// The stream ends quietly on a deadline; an empty read is not an ID.
	id := strings.TrimSpace(string(b))
	if id == "" {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return "", nodeErr(node, "read boot id", ctxErr)
		}

		return "", nodeErr(node, "read boot id", fmt.Errorf("%s is empty", bootIDPath))
	}

	return id, nil
}

// EtcdMember is one member of the etcd cluster, as a control plane sees it.
type EtcdMember struct {
	// ID is the member ID.
	ID uint64
	// Hostname is the member's name (the node's hostname).
	Hostname string
	// IsLearner is true while the member has not been promoted to voter.
	IsLearner bool
	// PeerURLs are the member's peer URLs (its address, when no Node
	// matches it).
	PeerURLs []string
}

// EtcdMembers returns the etcd members as a control plane's own etcd reports
// them.
func (c *Client) EtcdMembers(ctx context.Context, node string) ([]EtcdMember, error) {
	resp, err := c.c.EtcdMemberList(client.WithNode(ctx, node), &machine.EtcdMemberListRequest{QueryLocal: true})
	if err != nil {
		return nil, nodeErr(node, "list etcd members", err)
	}

	if len(resp.GetMessages()) == 0 {
		return nil, nodeErr(node, "list etcd members", errors.New("no reply"))
	}

	var members []EtcdMember
	for _, m := range resp.GetMessages()[0].GetMembers() {
		members = append(members, EtcdMember{ID: m.GetId(), Hostname: m.GetHostname(), IsLearner: m.GetIsLearner(), PeerURLs: m.GetPeerUrls()})
	}

	return members, nil
}

// Upgrade upgrades a node's Talos to the installer image and reboots it: it
// pulls the image, runs LifecycleService.Upgrade to its end (a non-zero exit
// code is an error) and calls Reboot. On a Talos without the lifecycle
// service it falls back to the deprecated MachineService.Upgrade, which
// reboots by itself. It returns once the reboot is requested; the caller
// watches the boot ID. Give it its own deadline of minutes.
func (c *Client) Upgrade(ctx context.Context, node, image string) error {
	nodeCtx := client.WithNode(ctx, node)

	name, err := c.pull(ctx, node, NamespaceSystem, image)

	switch {
	case IsUnimplemented(err):
		return c.legacyUpgrade(nodeCtx, node, image)
	case err != nil:
		return nodeErr(node, "upgrade: pull "+image, err)
	}

	err = c.lifecycleUpgrade(nodeCtx, name)

	switch {
	case IsUnimplemented(err):
		return c.legacyUpgrade(nodeCtx, node, image)
	case err != nil:
		return nodeErr(node, "upgrade to "+image, err)
	}

	if err := c.c.Reboot(nodeCtx); err != nil {
		return nodeErr(node, "upgrade to "+image+": reboot", err)
	}

	return nil
}

// ErrInstallStreamEnded is an upgrade stream that ended without the
// installer's exit code: the answer was lost, not given.
var ErrInstallStreamEnded = errors.New("the upgrade stream ended without an exit code")

// lifecycleUpgrade runs LifecycleService.Upgrade and drains its progress.
func (c *Client) lifecycleUpgrade(ctx context.Context, imageName string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	inst, err := NamespaceSystem.containerd()
	if err != nil {
		return err
	}

	stream, err := c.c.LifecycleClient.Upgrade(ctx, &machine.LifecycleServiceUpgradeRequest{
		Containerd: inst,
		Source:     &machine.InstallArtifactsSource{ImageName: imageName},
	})
	if err != nil {
		return err
	}

	var last []string // the last progress messages, for the error

	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return ErrInstallStreamEnded
		}

		if err != nil {
			return err
		}

		p := msg.GetProgress()

		switch r := p.GetResponse().(type) {
		case *machine.LifecycleServiceInstallProgress_Message:
			last = append(last, r.Message)
			if len(last) > 3 {
				last = last[1:]
			}
		case *machine.LifecycleServiceInstallProgress_ExitCode:
			if r.ExitCode != 0 {
				return fmt.Errorf("the installer exited with code %d (last output: %s)", r.ExitCode, strings.Join(last, "; "))
			}

			return nil
		}
	}
}

// legacyUpgrade is the deprecated single-call upgrade of a Talos without the
// lifecycle service; the node reboots by itself.
func (c *Client) legacyUpgrade(ctx context.Context, node, image string) error {
	//nolint:staticcheck // the deprecated call is the fallback for a Talos without LifecycleService.
	_, err := c.c.UpgradeWithOptions(ctx,
		client.WithUpgradeImage(image),
		client.WithUpgradeRebootMode(machine.UpgradeRequest_DEFAULT),
	)

	return nodeErr(node, "upgrade to "+image+" (MachineService)", err)
}

// Manifests returns the bootstrap manifests a control plane renders (the
// k8s.Manifest resources in the controlplane namespace), in Talos's order:
// resources by ID, objects in the order each holds them.
func (c *Client) Manifests(ctx context.Context, node string) ([]*unstructured.Unstructured, error) {
	list, err := safe.StateListAll[*k8s.Manifest](client.WithNode(ctx, node), c.c.COSI)
	if err != nil {
		return nil, nodeErr(node, "list manifests", err)
	}

	manifests := slices.Collect(list.All())
	slices.SortStableFunc(manifests, func(a, b *k8s.Manifest) int {
		return strings.Compare(a.Metadata().ID(), b.Metadata().ID())
	})

	var objects []*unstructured.Unstructured

	for _, m := range manifests {
		for i, item := range m.TypedSpec().Items {
			// Through JSON, so every value is of a type unstructured handles.
			b, err := json.Marshal(item.Object)
			if err != nil {
				return nil, nodeErr(node, "list manifests", fmt.Errorf("manifest %s, object %d: %w", m.Metadata().ID(), i, err))
			}

			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(b); err != nil {
				return nil, nodeErr(node, "list manifests", fmt.Errorf("manifest %s, object %d: %w", m.Metadata().ID(), i, err))
			}

			objects = append(objects, u)
		}
	}

	return objects, nil
}
