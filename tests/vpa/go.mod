// Test infrastructure: the Vertical Pod Autoscaler's recommender, the right-sizing backtest's baseline.
module tailor.sh/test/vpa

go 1.26.0

require k8s.io/autoscaler/vertical-pod-autoscaler v1.8.1
