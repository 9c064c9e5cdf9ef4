package render

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
)

// Component names one of the five Kubernetes components whose image a Talos
// machine config carries.
type Component string

// The five components, named as their images and static pods are.
const (
	APIServer         Component = "kube-apiserver"
	ControllerManager Component = "kube-controller-manager"
	Scheduler         Component = "kube-scheduler"
	KubeProxy         Component = "kube-proxy"
	Kubelet           Component = "kubelet"
)

// Components returns the five components in a fixed order: the order in
// which the stages move them.
func Components() []Component {
	return []Component{APIServer, ControllerManager, Scheduler, KubeProxy, Kubelet}
}

// Path returns the v1alpha1 machine config path of the component's image,
// such as "cluster.apiServer.image", or "" for an unknown component.
func (c Component) Path() string {
	switch c {
	case APIServer:
		return "cluster.apiServer.image"
	case ControllerManager:
		return "cluster.controllerManager.image"
	case Scheduler:
		return "cluster.scheduler.image"
	case KubeProxy:
		return "cluster.proxy.image"
	case Kubelet:
		return "machine.kubelet.image"
	default:
		return ""
	}
}

// Versions is the image tag each component should carry, such as "v1.36.3".
// A version without the leading "v" ("1.36.3") gets one, as every Kubernetes
// image tag has it. A component absent from the map is left as it is.
type Versions map[Component]string

// Uniform returns Versions that give every listed component the same version;
// with no component listed, all five.
func Uniform(version string, components ...Component) Versions {
	if len(components) == 0 {
		components = Components()
	}

	v := make(Versions, len(components))
	for _, c := range components {
		v[c] = version
	}

	return v
}

// tags checks every component and returns the image tag of each.
func (v Versions) tags() (map[Component]string, error) {
	tags := make(map[Component]string, len(v))

	for c, version := range v {
		if c.Path() == "" {
			return nil, fmt.Errorf("unknown component %q: want one of %s", c, joinComponents(Components()))
		}

		tag, err := versionTag(version)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c, err)
		}

		tags[c] = tag
	}

	return tags, nil
}

// versionTag turns a version into an image tag: "1.36.3" and "v1.36.3" both
// give "v1.36.3". A doubled "vv" is refused, not passed on: an image tagged
// "vv1.36.3" does not exist and the node would fail to pull it.
func versionTag(version string) (string, error) {
	tag := strings.TrimSpace(version)
	if tag == "" {
		return "", errors.New("empty version: give the tag, such as v1.36.3")
	}

	if tag[0] >= '0' && tag[0] <= '9' {
		tag = "v" + tag
	}

	if len(tag) > 2 && tag[0] == 'v' && tag[1] == 'v' && tag[2] >= '0' && tag[2] <= '9' {
		return "", fmt.Errorf("version %q has a doubled v: give it as v%s", version, tag[2:])
	}

	if !validTag(tag) {
		return "", fmt.Errorf("version %q is not a valid image tag", version)
	}

	return tag, nil
}

// Change is one image the render changed.
type Change struct {
	// Component is the component whose image changed.
	Component Component
	// Path is the machine config path, such as "cluster.apiServer.image".
	Path string
	// From is the image before (the effective one: Talos's default image
	// when the field was empty).
	From string
	// To is the image after: From's repository with the new tag.
	To string
	// DroppedDigest is the digest From was pinned to and To no longer is
	// ("" when From had none). Worth telling the user: they pinned it.
	DroppedDigest string
}

// Result is a rendered stage config.
type Result struct {
	// Config is the rendered config: the node's config with only the
	// changed image tags different.
	Config config.Provider
	// Bytes is Config encoded for ApplyConfiguration (no comments).
	Bytes []byte
	// Hash is Hash(Config): compare it with Hash of the node's active config
	// to tell whether this render is already applied.
	Hash string
	// Changed lists the images changed, in the order of Components; empty
	// when the node already carries every wanted version.
	Changed []Change
	// Skipped names the components asked for that this node does not carry
	// in its config, with the reason (a worker has no control plane; a
	// disabled kube-proxy).
	Skipped map[Component]string
}

// Render returns cfg with the image of every component in want set to its
// version, keeping each image's repository as the user wrote it. Nothing else
// changes: every other field and every other document of a multi-document
// config stays as it is, which Render checks on the encoded result before
// returning it.
//
// An image already on the wanted tag is left alone, digest included. An image
// pinned to a digest and moved to another tag loses the digest (a digest
// would override the new tag), and the Change says so in DroppedDigest.
//
// Render refuses a config with no v1alpha1 document, no machine section, an
// unknown machine type, or a control plane with no cluster section.
func Render(cfg config.Provider, want Versions) (*Result, error) {
	raw, err := v1alpha1Of(cfg)
	if err != nil {
		return nil, err
	}

	tags, err := want.tags()
	if err != nil {
		return nil, err
	}

	res := &Result{Skipped: map[Component]string{}}

	for _, c := range Components() {
		tag, ok := tags[c]
		if !ok {
			continue
		}

		current, skip := imageOf(raw, c)
		if skip != "" {
			res.Skipped[c] = skip

			continue
		}

		ref, err := parseImage(current)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Path(), err)
		}

		if ref.tag == tag {
			continue
		}

		res.Changed = append(res.Changed, Change{
			Component:     c,
			Path:          c.Path(),
			From:          current,
			To:            ref.repository + ":" + tag,
			DroppedDigest: ref.digest,
		})
	}

	// Clone first: PatchV1Alpha1 shares the other documents with its receiver.
	rendered, err := cfg.Clone().PatchV1Alpha1(func(c *v1alpha1.Config) error {
		for _, ch := range res.Changed {
			setImage(c, ch.Component, ch.To)
		}

		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("patch the v1alpha1 document: %w", err)
	}

	res.Bytes, err = rendered.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return nil, fmt.Errorf("encode the rendered config: %w", err)
	}

	// Check what is shipped, not what is in memory: the bytes must decode to
	// the node's config with only the planned image paths different.
	shipped, err := configloader.NewFromBytes(res.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the rendered config does not load back (a bug in ichor): %w", err)
	}

	allowed := make([]Component, 0, len(res.Changed))
	for _, ch := range res.Changed {
		allowed = append(allowed, ch.Component)
	}

	if err := verify(cfg, shipped, allowed); err != nil {
		return nil, fmt.Errorf("the rendered config changes more than image tags (a bug in ichor): %w", err)
	}

	res.Config = rendered

	res.Hash, err = Hash(rendered)
	if err != nil {
		return nil, err
	}

	return res, nil
}

// Images returns the image each component runs according to cfg, keyed by
// component. A component the config does not carry is absent: a worker has
// no control-plane images, a disabled kube-proxy has none. An empty image
// field gives Talos's default image, as the node itself would. A config
// Render would refuse gives an empty map.
func Images(cfg config.Provider) map[Component]string {
	images := map[Component]string{}

	raw, err := v1alpha1Of(cfg)
	if err != nil {
		return images
	}

	for _, c := range Components() {
		if image, skip := imageOf(raw, c); skip == "" {
			images[c] = image
		}
	}

	return images
}

// v1alpha1Of returns the v1alpha1 document of cfg, refusing a config Render
// cannot work on.
func v1alpha1Of(cfg config.Provider) (*v1alpha1.Config, error) {
	if cfg == nil {
		return nil, errors.New("no machine config")
	}

	raw := cfg.RawV1Alpha1()
	if raw == nil {
		return nil, errors.New("the machine config has no v1alpha1 document, which is where Talos keeps the " +
			"Kubernetes component images: ichor cannot render it; check the node's config with " +
			"`talosctl get machineconfig v1alpha1 -o yaml`")
	}

	if raw.MachineConfig == nil {
		return nil, errors.New("the machine config has no machine section: ichor cannot render it; check the " +
			"node's config with `talosctl get machineconfig v1alpha1 -o yaml`")
	}

	t := raw.MachineConfig.Type()
	if !t.IsControlPlane() && t != machine.TypeWorker {
		return nil, fmt.Errorf("machine.type %q is neither controlplane nor worker: ichor cannot tell which "+
			"images the node runs", raw.MachineConfig.MachineType)
	}

	if t.IsControlPlane() && raw.ClusterConfig == nil {
		return nil, errors.New("the control plane's machine config has no cluster section, so it carries no " +
			"control-plane images: ichor cannot render it; check the node's config with " +
			"`talosctl get machineconfig v1alpha1 -o yaml`")
	}

	return raw, nil
}

// imageOf returns the effective image of a component, or why the config does
// not carry it.
func imageOf(c *v1alpha1.Config, comp Component) (image, skip string) {
	controlPlane := c.Machine().Type().IsControlPlane()

	switch comp {
	case Kubelet:
		return c.Machine().Kubelet().Image(), ""
	case KubeProxy:
		if !controlPlane {
			return "", "a worker's config carries no kube-proxy: it runs from the DaemonSet the control planes sync"
		}

		if !c.Cluster().Proxy().Enabled() {
			return "", "kube-proxy is disabled (cluster.proxy.disabled)"
		}

		return c.Cluster().Proxy().Image(), ""
	case APIServer, ControllerManager, Scheduler:
		if !controlPlane {
			return "", "a worker runs no control plane"
		}

		switch comp {
		case APIServer:
			return c.Cluster().APIServer().Image(), ""
		case ControllerManager:
			return c.Cluster().ControllerManager().Image(), ""
		default:
			return c.Cluster().Scheduler().Image(), ""
		}
	default:
		return "", "unknown component"
	}
}

// setImage writes a component's image field, creating its section when the
// config left it to Talos's default. v1alpha1Of guarantees the machine section
// and, on a control plane, the cluster section.
func setImage(c *v1alpha1.Config, comp Component, image string) {
	switch comp {
	case Kubelet:
		if c.MachineConfig.MachineKubelet == nil {
			c.MachineConfig.MachineKubelet = &v1alpha1.KubeletConfig{}
		}

		c.MachineConfig.MachineKubelet.KubeletImage = image
	case KubeProxy:
		if c.ClusterConfig.ProxyConfig == nil {
			c.ClusterConfig.ProxyConfig = &v1alpha1.ProxyConfig{}
		}

		c.ClusterConfig.ProxyConfig.ContainerImage = image
	case APIServer:
		if c.ClusterConfig.APIServerConfig == nil {
			c.ClusterConfig.APIServerConfig = &v1alpha1.APIServerConfig{}
		}

		c.ClusterConfig.APIServerConfig.ContainerImage = image
	case ControllerManager:
		if c.ClusterConfig.ControllerManagerConfig == nil {
			c.ClusterConfig.ControllerManagerConfig = &v1alpha1.ControllerManagerConfig{}
		}

		c.ClusterConfig.ControllerManagerConfig.ContainerImage = image
	case Scheduler:
		if c.ClusterConfig.SchedulerConfig == nil {
			c.ClusterConfig.SchedulerConfig = &v1alpha1.SchedulerConfig{}
		}

		c.ClusterConfig.SchedulerConfig.ContainerImage = image
	}
}

func joinComponents(cs []Component) string {
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, string(c))
	}

	slices.Sort(names)

	return strings.Join(names, ", ")
}
