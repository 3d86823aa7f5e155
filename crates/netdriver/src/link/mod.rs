//! Links: pipes of whole Ethernet frames that the channels run over.
