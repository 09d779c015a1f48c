"""The models: ResNet-18 in torch and flax, the tuned step's transformations
(tuned_model) and the conv + BN statistics fusion (fused_convbn)."""
