"""Model zoo: the TensorFlow Privacy tutorial CNN, a GroupNorm ResNet, MiniLM-L6 (fine-tuned, or frozen sentence embeddings
under a head), EfficientNet-Lite0 (fine-tuned whole with frozen BatchNorm statistics, or frozen under a head) and a ScatterNet
(kymatio's scattering transform) under trainable heads.  Every example's output depends on that example only, and their
trainable parts have exact per-example gradients."""

from dpnoise.models.cnn import TFPrivacyTutorialCNN
from dpnoise.models.efficientnet_lite import (
    EfficientNetLite0,
    EfficientNetLite0Classifier,
    FrozenFeatureClassifier,
    freeze_batchnorms,
    pretrained_efficientnet_lite0,
)
from dpnoise.models.errors import InvalidModelError, ModelNotAvailableError
from dpnoise.models.features import FeatureClassifier, extract_features
from dpnoise.models.minilm import (
    TRAINABLE_PARTS,
    MiniLMClassifier,
    MiniLMSentenceClassifier,
    build_minilm,
    build_minilm_features,
    minilm_sequence_classifier,
)
from dpnoise.models.registry import MODELS, build_model, count_trainable_parameters
from dpnoise.models.resnet_gn import ResNetGN
from dpnoise.models.scatternet import ScatterNet, ScatterNetClassifier, build_scatternet

__all__ = [
    "MODELS",
    "TRAINABLE_PARTS",
    "EfficientNetLite0",
    "EfficientNetLite0Classifier",
    "FeatureClassifier",
    "FrozenFeatureClassifier",
    "InvalidModelError",
    "MiniLMClassifier",
    "MiniLMSentenceClassifier",
    "ModelNotAvailableError",
    "ResNetGN",
    "ScatterNet",
    "ScatterNetClassifier",
    "TFPrivacyTutorialCNN",
    "build_minilm",
    "build_minilm_features",
    "build_model",
    "build_scatternet",
    "count_trainable_parameters",
    "extract_features",
    "freeze_batchnorms",
    "minilm_sequence_classifier",
    "pretrained_efficientnet_lite0",
]
