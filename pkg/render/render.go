package render

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/stdpatches"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
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

// Layout is where a machine config keeps a component's image.
type Layout string

const (
	// V1Alpha1 is the v1alpha1 document's field (machine.kubelet.image,
	// cluster.apiServer.image, ...): every config made with the Talos 1.13
	// contract or older, and the configs of nodes upgraded from such a Talos,
	// which keep them.
	V1Alpha1 Layout = "v1alpha1"
	// Document is the component's own document of the Talos 1.14 contract
	// (KubeletConfig, KubeAPIServerConfig, ...), field image.
	Document Layout = "multi-doc"
)

// Kind returns the Talos 1.14 document that holds the component's settings,
// such as "KubeAPIServerConfig", or "" for an unknown component.
func (c Component) Kind() string {
	switch c {
	case APIServer:
		return k8s.KubeAPIServerConfig
	case ControllerManager:
		return k8s.KubeControllerManagerConfig
	case Scheduler:
		return k8s.KubeSchedulerConfig
	case KubeProxy:
		return k8s.KubeProxyConfig
	case Kubelet:
		return k8s.KubeletConfig
	default:
		return ""
	}
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

// PathIn returns the path of the component's image in a layout:
// "cluster.apiServer.image" in V1Alpha1, "KubeAPIServerConfig: image" in
// Document (the form Verify names a path of another document in).
func (c Component) PathIn(l Layout) string {
	if l == Document {
		if kind := c.Kind(); kind != "" {
			return kind + ": image"
		}

		return ""
	}

	return c.Path()
}

// LayoutOf returns where cfg keeps the component's image: Document when the
// config has the component's own document, V1Alpha1 otherwise. Talos refuses
// a config that sets a component in both (a v1alpha1 section next to its
// document), so the two cannot disagree on a config a node runs.
func LayoutOf(cfg config.Container, c Component) Layout {
	if cfg != nil && cfg.Has(c.Kind()) {
		return Document
	}

	return V1Alpha1
}

// Layouts returns the layout of every component cfg carries (see Images):
// a worker has only the kubelet.
func Layouts(cfg config.Provider) map[Component]Layout {
	layouts := map[Component]Layout{}

	for c := range Images(cfg) {
		layouts[c] = LayoutOf(cfg, c)
	}

	return layouts
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
	// Layout is where the node's config keeps the image; the render changed
	// it there.
	Layout Layout
	// Path is the machine config path, such as "cluster.apiServer.image" or
	// "KubeAPIServerConfig: image" (see Component.PathIn).
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
// version, keeping each image's repository as the user wrote it. Each image
// is changed where the node keeps it (see LayoutOf), never moved from one
// layout to the other: a node upgraded from Talos 1.13 keeps its v1alpha1
// fields, a config made for Talos 1.14 its documents, a mixed config each
// component where it is. The patches are machinery's own
// (config/generate/stdpatches), applied with its configpatcher. Nothing else
// changes: every other field and every other document stays as it is, which
// Render checks on the encoded result before returning it.
//
// An image already on the wanted tag is left alone, digest included. An image
// pinned to a digest and moved to another tag loses the digest (a digest
// would override the new tag), and the Change says so in DroppedDigest.
//
// Render refuses a config with no v1alpha1 document or machine section (the
// machine type lives there), an unknown machine type, or a control plane
// whose config holds its control-plane images in neither layout.
func Render(cfg config.Provider, want Versions) (*Result, error) {
	changed, skipped, err := changes(cfg, want)
	if err != nil {
		return nil, err
	}

	res := &Result{Changed: changed, Skipped: skipped}

	patches := make([]configpatcher.Patch, 0, len(changed))

	for _, ch := range changed {
		patch, err := imagePatch(cfg, ch.Component, ch.To)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ch.Path, err)
		}

		patches = append(patches, patch)
	}

	rendered := cfg
	if len(patches) > 0 {
		// Apply works on a copy; the node's config is never changed in place.
		out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), patches)
		if err != nil {
			return nil, fmt.Errorf("patch the machine config: %w", err)
		}

		if rendered, err = out.Config(); err != nil {
			return nil, fmt.Errorf("patch the machine config: %w", err)
		}
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

	res.Config = shipped

	res.Hash, err = Hash(shipped)
	if err != nil {
		return nil, err
	}

	return res, nil
}

// Changes returns the images Render(cfg, want) would change, as its Result's
// Changed, and refuses what Render refuses before it patches anything, without
// patching, encoding or verifying: enough to tell whether a render changes a
// config, at a small part of a render's cost.
func Changes(cfg config.Provider, want Versions) ([]Change, error) {
	changed, _, err := changes(cfg, want)

	return changed, err
}

// changes is Render's first half: the images it changes, in the order of
// Components, and the components asked for that cfg does not carry.
func changes(cfg config.Provider, want Versions) ([]Change, map[Component]string, error) {
	if err := renderable(cfg); err != nil {
		return nil, nil, err
	}

	tags, err := want.tags()
	if err != nil {
		return nil, nil, err
	}

	var changed []Change

	skipped := map[Component]string{}

	for _, c := range Components() {
		tag, ok := tags[c]
		if !ok {
			continue
		}

		current, skip := imageOf(cfg, c)
		if skip != "" {
			skipped[c] = skip

			continue
		}

		layout := LayoutOf(cfg, c)

		ref, err := parseImage(current)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", c.PathIn(layout), err)
		}

		if ref.tag == tag {
			continue
		}

		changed = append(changed, Change{
			Component:     c,
			Layout:        layout,
			Path:          c.PathIn(layout),
			From:          current,
			To:            ref.repository + ":" + tag,
			DroppedDigest: ref.digest,
		})
	}

	return changed, skipped, nil
}

// imagePatch returns machinery's patch setting the component's image in the
// layout cfg keeps it in: a strategic merge patch of the v1alpha1 fields, or
// of the component's document.
func imagePatch(cfg config.Provider, c Component, image string) (configpatcher.Patch, error) {
	var (
		patch []byte
		err   error
	)

	switch c {
	case Kubelet:
		patch, err = stdpatches.WithKubeletImage(stdpatches.GuessVersionContractKubelet(cfg), image)
	case KubeProxy:
		patch, err = stdpatches.WithKubeProxyImage(stdpatches.GuessVersionContractKubeProxy(cfg), image)
	case APIServer:
		patch, err = stdpatches.WithKubeAPIServerImage(stdpatches.GuessVersionContractKubeAPIServer(cfg), image)
	case ControllerManager:
		patch, err = stdpatches.WithKubeControllerManagerImage(
			stdpatches.GuessVersionContractKubeControllerManager(cfg), image)
	case Scheduler:
		patch, err = stdpatches.WithKubeSchedulerImage(stdpatches.GuessVersionContractKubeScheduler(cfg), image)
	default:
		return nil, fmt.Errorf("unknown component %q", c)
	}

	return stdpatches.PreparePatch(patch, err)
}

// Images returns the image each component runs according to cfg, keyed by
// component, whichever layout holds it. A component the config does not
// carry is absent: a worker has no control-plane images, a disabled
// kube-proxy has none. An empty v1alpha1 image field gives Talos's default
// image, as the node itself would. A config Render would refuse gives an
// empty map.
func Images(cfg config.Provider) map[Component]string {
	images := map[Component]string{}

	if renderable(cfg) != nil {
		return images
	}

	for _, c := range Components() {
		if image, skip := imageOf(cfg, c); skip == "" {
			images[c] = image
		}
	}

	return images
}

// talosConfigHint is how a user looks at what Render could not work with.
const talosConfigHint = "check the node's config with `talosctl get machineconfig -o yaml`"

// renderable refuses a config Render cannot work on.
func renderable(cfg config.Provider) error {
	if cfg == nil {
		return errors.New("no machine config")
	}

	raw := cfg.RawV1Alpha1()
	if raw == nil || raw.MachineConfig == nil {
		return errors.New("the machine config has no v1alpha1 machine section, which says whether the node is a " +
			"control plane or a worker: ichor cannot render it; " + talosConfigHint)
	}

	t := raw.MachineConfig.Type()
	if !t.IsControlPlane() && t != machine.TypeWorker {
		return fmt.Errorf("machine.type %q is neither controlplane nor worker: ichor cannot tell which "+
			"images the node runs", raw.MachineConfig.MachineType)
	}

	if t.IsControlPlane() && raw.ClusterConfig == nil && !cfg.Has(k8s.KubeAPIServerConfig) {
		return errors.New("the control plane's machine config has neither a cluster section nor a " +
			"KubeAPIServerConfig document, so it carries no control-plane images: ichor cannot render it; " +
			talosConfigHint)
	}

	return nil
}

// imageOf returns the effective image of a component, or why the config does
// not carry it. renderable(cfg) holds.
func imageOf(cfg config.Provider, comp Component) (image, skip string) {
	controlPlane := cfg.RawV1Alpha1().MachineConfig.Type().IsControlPlane()

	switch comp {
	case Kubelet:
		if k := cfg.K8sKubeletConfig(); k != nil {
			return k.Image(), ""
		}

		return "", "the config carries no kubelet"
	case KubeProxy:
		if !controlPlane {
			return "", "a worker's config carries no kube-proxy: it runs from the DaemonSet the control planes sync"
		}

		if p := cfg.K8sProxyConfig(); p != nil && p.Enabled() {
			return p.Image(), ""
		}

		return "", disabled(cfg, comp)
	case APIServer:
		if !controlPlane {
			return "", "a worker runs no control plane"
		}

		return cfg.K8sAPIServerConfig().Image(), ""
	case ControllerManager:
		if !controlPlane {
			return "", "a worker runs no control plane"
		}

		if m := cfg.K8sControllerManagerConfig(); m.Enabled() {
			return m.Image(), ""
		}

		return "", disabled(cfg, comp)
	case Scheduler:
		if !controlPlane {
			return "", "a worker runs no control plane"
		}

		if s := cfg.K8sSchedulerConfig(); s.Enabled() {
			return s.Image(), ""
		}

		return "", disabled(cfg, comp)
	default:
		return "", "unknown component"
	}
}

// disabled says that a component is disabled, naming the setting where cfg
// keeps it.
func disabled(cfg config.Provider, c Component) string {
	setting := c.Kind() + " enabled: false"

	if LayoutOf(cfg, c) == V1Alpha1 {
		switch c {
		case KubeProxy:
			setting = "cluster.proxy.disabled"
		case ControllerManager:
			setting = "machine.controlPlane.controllerManager.disabled"
		case Scheduler:
			setting = "machine.controlPlane.scheduler.disabled"
		}
	}

	return fmt.Sprintf("%s is disabled (%s)", c, setting)
}

func joinComponents(cs []Component) string {
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, string(c))
	}

	slices.Sort(names)

	return strings.Join(names, ", ")
}
