// Command kubelet-standin plays the kubelet for the fake nodes of Tailor's test control plane.
//
// It manages the Nodes annotated kwok.x-k8s.io/node=fake (the convention KWOK and Karpenter's
// KWOK provider use) and the pods bound to them:
//
//   - a node is marked Ready, with the usual conditions, addresses and node info, and its Lease in
//     kube-node-lease is renewed, so kube-controller-manager's node lifecycle keeps it healthy;
//   - a pod bound to such a node becomes Running and Ready, with containerStatuses[].resources
//     and allocatedResources filled from the spec, so the API server accepts in-place resizes
//     (pods/resize); after a resize the new resources are written to status, or the resize is
//     marked Infeasible when the node's allocatable cannot hold it;
//   - a pod with a deletionTimestamp is finished (deleted with grace period 0), so evictions
//     and drains complete.
//
// Stock KWOK does all but the resize part; this stand-in exists because in-place resize needs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"os/signal"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const (
	managedAnnotation = "kwok.x-k8s.io/node"
	managedValue      = "fake"
	leaseNamespace    = "kube-node-lease"
	leaseSeconds      = 40
	kubeletVersion    = "v1.35.4"
)

type standin struct {
	client kubernetes.Interface
	nodes  listersv1.NodeLister
	pods   listersv1.PodLister
	podIdx cache.Indexer
	nodeQ  workqueue.TypedRateLimitingInterface[string]
	podQ   workqueue.TypedRateLimitingInterface[string]
	// pod IPs are handed out from a counter; the value is only cosmetic.
	mu     sync.Mutex
	nextIP uint32
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	workers := flag.Int("workers", 8, "parallel pod and node workers")
	klog.InitFlags(nil)
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig %q: %v", *kubeconfig, err)
	}
	// Hundreds of nodes renew a lease every few seconds: the default 5 QPS would starve them.
	cfg.QPS = 500
	cfg.Burst = 1000
	cfg.UserAgent = "kubelet-standin"
	client := kubernetes.NewForConfigOrDie(cfg)

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	factory := informers.NewSharedInformerFactory(client, 0)
	nodeInformer := factory.Core().V1().Nodes()
	podInformer := factory.Core().V1().Pods()
	if err := podInformer.Informer().AddIndexers(cache.Indexers{"node": func(obj any) ([]string, error) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return nil, nil
		}
		return []string{pod.Spec.NodeName}, nil
	}}); err != nil {
		klog.Fatal(err)
	}
	s := &standin{
		client: client,
		nodes:  nodeInformer.Lister(),
		pods:   podInformer.Lister(),
		podIdx: podInformer.Informer().GetIndexer(),
		nodeQ:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		podQ:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	enqueueNode := func(obj any) {
		if node, ok := obj.(*corev1.Node); ok && managed(node) {
			s.nodeQ.Add(node.Name)
			// Pods bound before their node was managed (or seen) are looked at again.
			for _, p := range s.podsOn(node.Name) {
				s.podQ.Add(p.Namespace + "/" + p.Name)
			}
		}
	}
	nodeInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueueNode,
		UpdateFunc: func(_, obj any) { enqueueNode(obj) },
	})
	enqueuePod := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
			s.podQ.Add(pod.Namespace + "/" + pod.Name)
		}
	}
	podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueuePod,
		UpdateFunc: func(_, obj any) { enqueuePod(obj) },
	})
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			klog.Fatalf("cache for %v did not sync", typ)
		}
	}
	klog.Info("kubelet stand-in synced")

	for i := 0; i < *workers; i++ {
		go wait.UntilWithContext(ctx, func(ctx context.Context) { s.run(ctx, s.nodeQ, s.syncNode) }, time.Second)
		go wait.UntilWithContext(ctx, func(ctx context.Context) { s.run(ctx, s.podQ, s.syncPod) }, time.Second)
	}
	go wait.UntilWithContext(ctx, s.renewLeases, 10*time.Second)
	<-ctx.Done()
	s.nodeQ.ShutDown()
	s.podQ.ShutDown()
}

func managed(node *corev1.Node) bool {
	return node.Annotations[managedAnnotation] == managedValue
}

func (s *standin) podsOn(node string) []*corev1.Pod {
	objs, err := s.podIdx.ByIndex("node", node)
	if err != nil {
		return nil
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			pods = append(pods, p)
		}
	}
	return pods
}

func (s *standin) run(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error) {
	for {
		key, shutdown := q.Get()
		if shutdown {
			return
		}
		if err := sync(ctx, key); err != nil {
			if !apierrors.IsConflict(err) {
				klog.V(2).Infof("%s: %v", key, err)
			}
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

// syncNode makes a managed node Ready with the status a kubelet reports.
func (s *standin) syncNode(ctx context.Context, name string) error {
	node, err := s.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if !managed(node) || node.DeletionTimestamp != nil || nodeReady(node) {
		return nil
	}
	now := metav1.Now()
	node = node.DeepCopy()
	if len(node.Status.Allocatable) == 0 {
		node.Status.Allocatable = node.Status.Capacity.DeepCopy()
	}
	condition := func(t corev1.NodeConditionType, status corev1.ConditionStatus, reason, message string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: status, Reason: reason, Message: message, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	node.Status.Conditions = []corev1.NodeCondition{
		condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet stand-in is posting ready status"),
		condition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		condition(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		condition(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		condition(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "RouteCreated", "the stand-in needs no routes"),
	}
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: nodeIP(name)},
		{Type: corev1.NodeHostName, Address: name},
	}
	node.Status.NodeInfo = corev1.NodeSystemInfo{
		KubeletVersion:          kubeletVersion,
		OperatingSystem:         "linux",
		Architecture:            orDefault(node.Labels[corev1.LabelArchStable], "amd64"),
		ContainerRuntimeVersion: "standin://1.0",
		KernelVersion:           "6.1.0",
		OSImage:                 "kubelet stand-in",
	}
	node.Status.Phase = corev1.NodeRunning
	_, err = s.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	if err == nil {
		return s.renewLease(ctx, node)
	}
	return err
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (s *standin) renewLeases(ctx context.Context) {
	nodes, err := s.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	for _, node := range nodes {
		if managed(node) && node.DeletionTimestamp == nil {
			if err := s.renewLease(ctx, node); err != nil {
				klog.V(2).Infof("lease of %s: %v", node.Name, err)
			}
		}
	}
}

// renewLease creates or renews the node's Lease, as the kubelet's node lease controller does.
func (s *standin) renewLease(ctx context.Context, node *corev1.Node) error {
	leases := s.client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, node.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:      node.Name,
				Namespace: leaseNamespace,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(node.Name),
				LeaseDurationSeconds: ptr.To[int32](leaseSeconds),
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// syncPod runs, resizes or finishes a pod bound to a managed node.
func (s *standin) syncPod(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := s.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	node, err := s.nodes.Get(pod.Spec.NodeName)
	if err != nil || !managed(node) {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		err := s.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	if pod.Status.Phase != corev1.PodRunning {
		return s.start(ctx, pod, node)
	}
	return s.resize(ctx, pod, node)
}

func (s *standin) start(ctx context.Context, pod *corev1.Pod, node *corev1.Node) error {
	now := metav1.Now()
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.HostIP = nodeIP(node.Name)
	pod.Status.HostIPs = []corev1.HostIP{{IP: pod.Status.HostIP}}
	if pod.Spec.HostNetwork {
		pod.Status.PodIP = pod.Status.HostIP
	} else {
		pod.Status.PodIP = s.podIP()
	}
	pod.Status.PodIPs = []corev1.PodIP{{IP: pod.Status.PodIP}}
	pod.Status.StartTime = &now
	pod.Status.ObservedGeneration = pod.Generation
	pod.Status.QOSClass = qosClass(pod)
	var conditions []corev1.PodCondition
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			conditions = append(conditions, c)
		}
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		conditions = append(conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now, ObservedGeneration: pod.Generation})
	}
	pod.Status.Conditions = conditions
	pod.Status.InitContainerStatuses = nil
	for _, c := range pod.Spec.InitContainers {
		st := containerStatus(c, now)
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now, ContainerID: st.ContainerID,
			}}
			st.Ready = false
			st.Started = ptr.To(false)
		}
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, st)
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, containerStatus(c, now))
	}
	_, err := s.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

func containerStatus(c corev1.Container, now metav1.Time) corev1.ContainerStatus {
	return corev1.ContainerStatus{
		Name:               c.Name,
		Image:              c.Image,
		ImageID:            "standin://" + c.Image,
		ContainerID:        fmt.Sprintf("standin://%s", c.Name),
		Ready:              true,
		Started:            ptr.To(true),
		State:              corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		Resources:          c.Resources.DeepCopy(),
		AllocatedResources: c.Resources.Requests.DeepCopy(),
	}
}

// resize actuates a pending in-place resize: the spec's resources are copied to status when the
// node's allocatable holds every pod's requests, and the resize is marked Infeasible otherwise.
func (s *standin) resize(ctx context.Context, pod *corev1.Pod, node *corev1.Node) error {
	pending := false
	for i, c := range pod.Spec.Containers {
		if i < len(pod.Status.ContainerStatuses) && !sameResources(c.Resources, pod.Status.ContainerStatuses[i].Resources) {
			pending = true
		}
	}
	if !pending && pod.Status.ObservedGeneration == pod.Generation {
		return nil
	}
	pod = pod.DeepCopy()
	pod.Status.ObservedGeneration = pod.Generation
	var kept []corev1.PodCondition
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodResizePending && c.Type != corev1.PodResizeInProgress {
			c.ObservedGeneration = pod.Generation
			kept = append(kept, c)
		}
	}
	pod.Status.Conditions = kept
	if pending {
		if msg := s.doesNotFit(pod, node); msg != "" {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
				Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonInfeasible,
				Message: msg, LastTransitionTime: metav1.Now(), ObservedGeneration: pod.Generation,
			})
		} else {
			for i, c := range pod.Spec.Containers {
				if i < len(pod.Status.ContainerStatuses) {
					pod.Status.ContainerStatuses[i].Resources = c.Resources.DeepCopy()
					pod.Status.ContainerStatuses[i].AllocatedResources = c.Resources.Requests.DeepCopy()
				}
			}
			pod.Status.QOSClass = qosClass(pod)
		}
	}
	_, err := s.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// doesNotFit says why the node cannot hold the pod's new requests beside the other pods' current
// ones, or "" when it can.
func (s *standin) doesNotFit(pod *corev1.Pod, node *corev1.Node) string {
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		total := resource.Quantity{}
		for _, other := range s.podsOn(node.Name) {
			if other.UID == pod.UID || other.Status.Phase == corev1.PodSucceeded || other.Status.Phase == corev1.PodFailed {
				continue
			}
			for _, cs := range other.Status.ContainerStatuses {
				if cs.AllocatedResources != nil {
					q := cs.AllocatedResources[res]
					total.Add(q)
				}
			}
		}
		for _, c := range pod.Spec.Containers {
			q := c.Resources.Requests[res]
			total.Add(q)
		}
		allocatable := node.Status.Allocatable[res]
		if total.Cmp(allocatable) > 0 {
			return fmt.Sprintf("Node didn't have enough capacity: %s, requested: %s, capacity: %s", res, total.String(), allocatable.String())
		}
	}
	return ""
}

func sameResources(a corev1.ResourceRequirements, b *corev1.ResourceRequirements) bool {
	if b == nil {
		return false
	}
	return sameList(a.Requests, b.Requests) && sameList(a.Limits, b.Limits)
}

func sameList(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

func qosClass(pod *corev1.Pod) corev1.PodQOSClass {
	guaranteed, empty := true, true
	for _, c := range pod.Spec.Containers {
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[res]
			lim, hasLim := c.Resources.Limits[res]
			if hasReq || hasLim {
				empty = false
			}
			if !hasLim || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case empty:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

func (s *standin) podIP() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextIP++
	n := s.nextIP
	return fmt.Sprintf("10.%d.%d.%d", 100+(n>>16)%100, (n>>8)%256, n%256)
}

func nodeIP(name string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	n := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", (n>>16)%100, (n>>8)%256, 1+n%254)
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

