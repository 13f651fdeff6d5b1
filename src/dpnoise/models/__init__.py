"""Model zoo: the TensorFlow Privacy tutorial CNN, a GroupNorm ResNet, MiniLM-L6 (fine-tuned, or frozen sentence embeddings
under a head) and a frozen EfficientNet-Lite0 under a trainable head.  All are compatible with Opacus
per-example gradients in their trainable parts."""

from dpnoise.models.cnn import TFPrivacyTutorialCNN
from dpnoise.models.efficientnet_lite import EfficientNetLite0, FrozenFeatureClassifier, pretrained_efficientnet_lite0
from dpnoise.models.errors import InvalidModelError, ModelNotAvailableError
from dpnoise.models.features import FeatureClassifier, extract_features
from dpnoise.models.minilm import MiniLMClassifier, MiniLMSentenceClassifier, build_minilm, build_minilm_features
from dpnoise.models.registry import MODELS, build_model, count_trainable_parameters
from dpnoise.models.resnet_gn import ResNetGN

__all__ = [
    "MODELS",
    "EfficientNetLite0",
    "FeatureClassifier",
    "FrozenFeatureClassifier",
    "InvalidModelError",
    "MiniLMClassifier",
    "MiniLMSentenceClassifier",
    "ModelNotAvailableError",
    "ResNetGN",
    "TFPrivacyTutorialCNN",
    "build_minilm",
    "build_minilm_features",
    "build_model",
    "count_trainable_parameters",
    "extract_features",
    "pretrained_efficientnet_lite0",
]
