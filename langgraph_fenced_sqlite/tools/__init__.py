"""Tools over whole stores: importers from LangGraph's savers, transfer, doctor."""
